"""The mixed-type engine: local-polynomial fits over continuous, ordered and unordered
columns (``engine``) and their leave-one-out widths (``widths``)."""
