"""Device selection and the dispatch table (``device``), and every host/device transfer
(``transfer``): the only floor above ``nbattn.cuda`` that touches numba-cuda."""
