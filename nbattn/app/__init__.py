"""The application layer: the `nbattn` command, batch work over files, metrics, figures,
Dask, the datasets and the walk-through's demo. Nothing below imports it."""
