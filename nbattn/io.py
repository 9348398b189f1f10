"""Model files, and tables read and written in chunks.

Model files (``nbattn.save`` / ``nbattn.load``)
-----------------------------------------------
One ``.npz`` archive (a zip of ``.npy`` arrays) that never holds pickled
objects and is read with ``allow_pickle=False``, so loading cannot execute
code. Format ``"nbattn-model"``, version :data:`FORMAT_VERSION` (1):

* member ``__nbattn__``: a 0-d unicode array with the JSON metadata::

      {"format": "nbattn-model", "format_version": 1,
       "nbattn_version": "0.1.0", "estimator": "NadarayaWatsonRegressor",
       "params": {...get_params()...},
       "feature_names": ["income"] or null,
       "attributes": {"bandwidth_": {"kind": "array"}, "n_features_in_":
                      {"kind": "json", "value": 1}, ...},
       "user": {...},                      # free JSON from save(metadata=...)
       "sha256": "<hex digest>"}

* member ``attr__<name>`` for every attribute of kind ``"array"``.

The fitted state is every instance attribute whose name ends in ``_`` (the
scikit-learn convention) plus private ones (one leading ``_``) holding a
number, a string or an array, so new estimators need no new code here.
Arrays (numeric, bool or str; an object array of str, like
``feature_names_in_``, is stored as str and restored as object) go into the
archive; Python scalars, strings, None and lists of them go into the JSON.
``sha256`` is the SHA-256 of the canonical JSON of the metadata without that
key, followed by each array's name, dtype, shape and bytes in name order:
a truncated, corrupted or edited file raises a ValueError, as does another
format version or an estimator class that is not one of
``nbattn.estimators.__all__``.

Tables
------
:func:`iter_chunks` reads CSV (pandas, in chunks) or Parquet (pyarrow, in
record batches), :func:`numeric_block` turns chunk columns into float64 with
errors that name the row and the column, :class:`TableWriter` appends chunks
to CSV or Parquet, and :func:`atomic_output` makes the result appear under
its name only when everything was written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ModelFileError",
    "TableWriter",
    "atomic_output",
    "input_format",
    "iter_chunks",
    "load",
    "numeric_block",
    "output_format",
    "read_columns",
    "read_model_file",
    "read_table",
    "save",
]

FORMAT_NAME = "nbattn-model"
FORMAT_VERSION = 1
_META = "__nbattn__"
_PREFIX = "attr__"
_JSON_SCALARS = (bool, int, float, str, type(None))


# ----------------------------------------------------------------------------- atomic output


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    The temporary file lives in the same folder (so ``os.replace`` is an
    atomic rename) and is removed if the block raises: a failed run leaves
    neither a partial output nor a stray file, and an existing ``path`` is
    untouched until the new one is complete.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"output {str(path)!r} is a folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=folder)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- model files


def _estimator_classes() -> dict:
    """The whitelist: classes named in ``nbattn.estimators.__all__``."""
    from . import estimators

    out = {}
    for name in getattr(estimators, "__all__", ()):
        cls = getattr(estimators, name, None)
        if isinstance(cls, type) and hasattr(cls, "get_params"):
            out[name] = cls
    return out


def _jsonable(value, what: str):
    """Plain JSON value for a parameter or attribute, or raise."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufU":
            raise ValueError(f"cannot save {what}: array of dtype {value.dtype}")
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, what) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, what) for k, v in value.items()}
    if isinstance(value, _JSON_SCALARS):
        return value
    raise ValueError(f"cannot save {what}: values of type {type(value).__name__} are not supported")


def _array_for_file(value: np.ndarray):
    """(array to store, was an object array of str)."""
    if value.dtype.kind == "O":
        if not all(isinstance(v, str) for v in value.ravel()):
            raise TypeError("object array that is not all str")
        return np.asarray(value.tolist(), dtype=str).reshape(value.shape), True
    if value.dtype.kind not in "biufcU":
        raise TypeError(f"array of dtype {value.dtype}")
    return value, False


def _fitted_state(model):
    """(arrays, attribute descriptions) of the fitted state of ``model``."""
    params = set(model.get_params(deep=False))
    arrays, attributes = {}, {}
    for name, value in sorted(vars(model).items()):
        public = name.endswith("_") and not name.startswith("_")
        private = name.startswith("_") and not name.startswith("__")
        if name in params or not (public or private):
            continue
        try:
            if isinstance(value, np.ndarray | np.generic):
                is_scalar = isinstance(value, np.generic)
                stored, was_object = _array_for_file(np.asarray(value))
                arrays[_PREFIX + name] = stored
                attributes[name] = {"kind": "array", "object": was_object, "scalar": is_scalar}
            else:
                attributes[name] = {"kind": "json", "value": _jsonable(value, name)}
        except (TypeError, ValueError) as exc:
            if public:
                raise ValueError(f"cannot save fitted attribute {name!r}: {exc}") from exc
            # private state of another kind (caches, sklearn internals) is not saved
    return arrays, attributes


def _digest(meta: dict, arrays: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "sha256"}
    h = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def save(model, path, *, metadata=None) -> Path:
    """Write a fitted nbattn estimator to ``path`` (an ``.npz`` model file).

    The format is documented in :mod:`nbattn.io` (version
    :data:`FORMAT_VERSION`); it holds no pickled objects. The file is written
    to a temporary name and renamed, so ``path`` is never left half-written.

    Parameters
    ----------
    model : a fitted estimator from ``nbattn.estimators``
    path : str or Path
        Written as given (no extension is added; ``.npz`` is the convention).
    metadata : dict, optional
        Extra JSON-serialisable information kept in the file (the command
        line stores the target column here); read back with
        :func:`read_model_file`.

    Returns
    -------
    Path
    """
    from sklearn.utils.validation import check_is_fitted

    from . import __version__

    name = type(model).__name__
    if _estimator_classes().get(name) is not type(model):
        raise ValueError(
            f"nbattn.save writes nbattn estimators only; got {type(model).__module__}.{name}"
        )
    check_is_fitted(model)
    arrays, attributes = _fitted_state(model)
    names = getattr(model, "feature_names_in_", None)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nbattn_version": __version__,
        "estimator": name,
        "params": {
            k: _jsonable(v, f"parameter {k!r}") for k, v in model.get_params(deep=False).items()
        },
        "feature_names": None if names is None else [str(n) for n in names],
        "attributes": attributes,
        "user": _jsonable(metadata or {}, "metadata"),
    }
    meta["sha256"] = _digest(meta, arrays)
    members = {_META: np.array(json.dumps(meta, sort_keys=True)), **arrays}
    path = Path(path)
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **members)
    return path


class ModelFileError(ValueError):
    """A file that is not a readable nbattn model file of this format version."""


def _bad(path, why: str) -> ModelFileError:
    return ModelFileError(f"{path}: {why}")


def read_model_file(path):
    """Load a model file: ``(estimator, metadata dict)``.

    Raises ValueError for a file that is not an nbattn model file, one of
    another format version, a truncated, corrupted or edited one, or one
    naming an estimator class outside the whitelist.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":
        raise _bad(path, "not an nbattn model file (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if _META not in npz.files:
                raise _bad(path, "not an nbattn model file (no nbattn metadata)")
            raw = npz[_META]
            members = {n: npz[n] for n in npz.files if n != _META}
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as exc:
        # ValueError: among others numpy's refusal of pickled (object) members
        raise _bad(path, f"truncated, corrupt or foreign model file ({exc})") from exc
    if raw.dtype.kind != "U" or raw.ndim != 0:
        raise _bad(path, "not an nbattn model file (metadata is not a string)")
    try:
        meta = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise _bad(path, f"corrupt metadata ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise _bad(path, "not an nbattn model file (unknown format)")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise _bad(
            path,
            f"model file format version {version!r} (written by nbattn "
            f"{meta.get('nbattn_version', '?')}); this nbattn reads version {FORMAT_VERSION}",
        )
    if meta.get("sha256") != _digest(meta, members):
        raise _bad(path, "checksum mismatch: the model file was modified or is corrupt")
    try:
        model = _rebuild(path, meta, members)
    except (TypeError, AttributeError) as exc:  # well-formed JSON of the wrong shape
        raise _bad(path, f"invalid model description ({exc})") from exc
    return model, meta


def _rebuild(path, meta, members):
    classes = _estimator_classes()
    name = meta.get("estimator")
    if name not in classes:
        raise _bad(
            path,
            f"estimator {name!r} is not available in this nbattn (known: {sorted(classes)})",
        )
    cls = classes[name]
    params = meta.get("params", {})
    known = set(cls().get_params(deep=False))
    unknown = sorted(set(params) - known)
    if unknown:
        raise _bad(path, f"parameters {unknown} are not parameters of nbattn.{name}")
    model = cls(**params)
    for attr, info in meta.get("attributes", {}).items():
        if not isinstance(attr, str) or not attr.endswith("_") and not attr.startswith("_"):
            raise _bad(path, f"attribute name {attr!r} is not a fitted attribute")
        if attr in known or attr.startswith("__"):
            raise _bad(path, f"attribute name {attr!r} is not allowed")
        if info.get("kind") == "array":
            key = _PREFIX + attr
            if key not in members:
                raise _bad(path, f"array for attribute {attr!r} is missing")
            value = members[key]
            if info.get("object"):
                value = value.astype(object)
            if info.get("scalar"):
                value = value[()]
        elif info.get("kind") == "json":
            value = info.get("value")
        else:
            raise _bad(path, f"attribute {attr!r} has an unknown kind")
        setattr(model, attr, value)
    return model


def load(path):
    """Read an estimator written by :func:`save` (no code is executed).

    Raises ValueError for a foreign, truncated, edited or other-version file.
    """
    return read_model_file(path)[0]


# ----------------------------------------------------------------------------- tables

_PARQUET = (".parquet", ".pq")


def input_format(path) -> str:
    """Return "parquet" for ``.parquet``/``.pq`` files, "csv" for everything else."""
    return "parquet" if str(path).lower().endswith(_PARQUET) else "csv"


def output_format(path) -> str:
    """Return "csv" or "parquet" from the extension of an output; anything else is an error."""
    lower = str(path).lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith(_PARQUET):
        return "parquet"
    raise ValueError(f"output {str(path)!r} must end in .csv, .parquet or .pq")


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ValueError("Parquet files need pyarrow: pip install 'nbattn[parquet]'") from exc
    return pq


def _csv_error(path, exc) -> ValueError:
    import pandas as pd

    if isinstance(exc, pd.errors.EmptyDataError):
        return ValueError(f"{path}: the file is empty")
    return ValueError(f"{path}: cannot read as CSV: {' '.join(str(exc).split())}")


def _exact_floats() -> dict:
    """read_csv options that parse floats exactly (pandas 3 does by default; 2.x needs
    ``float_precision="round_trip"``, which pandas 3 deprecates)."""
    import pandas as pd

    major = int(pd.__version__.split(".")[0])
    return {} if major >= 3 else {"float_precision": "round_trip"}


def read_columns(path) -> list[str]:
    """The column names of a CSV or Parquet file (reads the header only)."""
    import pandas as pd

    path = Path(path)
    if input_format(path) == "parquet":
        pq = _pyarrow_parquet()
        try:
            return list(pq.read_schema(path).names)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: cannot read as Parquet: {exc}") from exc
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except (ValueError, pd.errors.ParserError) as exc:
        raise _csv_error(path, exc) from exc


def check_columns(path, columns, wanted, what="column") -> None:
    """ValueError naming the first of ``wanted`` that is not in ``columns``."""
    missing = [c for c in wanted if c not in columns]
    if missing:
        shown = ", ".join(repr(c) for c in columns[:20])
        more = " ..." if len(columns) > 20 else ""
        raise ValueError(f"{path}: {what} {missing[0]!r} not found; the columns are {shown}{more}")


def iter_chunks(path, columns=None, chunksize=100_000):
    """Read a CSV or Parquet file in chunks.

    Returns ``(chunks, total, unit)``: ``chunks`` yields
    ``(frame, first_row, position)`` with ``first_row`` the 0-based data row
    of the chunk's first row and ``position`` the progress so far in
    ``unit`` ("bytes" for CSV, "rows" for Parquet) out of ``total``.
    Only ``columns`` are read (all when None).
    """
    import pandas as pd

    path = Path(path)
    if chunksize < 1:
        raise ValueError(f"chunksize must be positive, got {chunksize}")
    if input_format(path) == "parquet":
        pq = _pyarrow_parquet()
        try:
            pf = pq.ParquetFile(path)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: cannot read as Parquet: {exc}") from exc
        total = pf.metadata.num_rows

        def parquet_chunks():
            row = 0
            for batch in pf.iter_batches(batch_size=chunksize, columns=columns):
                frame = batch.to_pandas()
                yield frame, row, row + len(frame)
                row += len(frame)

        return parquet_chunks(), total, "rows"

    total = path.stat().st_size
    if total == 0:
        raise ValueError(f"{path}: the file is empty")

    def csv_chunks():
        with open(path, "rb") as fh:
            try:
                reader = pd.read_csv(fh, usecols=columns, chunksize=chunksize, **_exact_floats())
                row = 0
                with reader:
                    for frame in reader:
                        yield frame, row, fh.tell()
                        row += len(frame)
            except (ValueError, pd.errors.ParserError) as exc:
                raise _csv_error(path, exc) from exc

    return csv_chunks(), total, "bytes"


def read_table(path, columns=None, *, quiet=True):
    """The whole file (only ``columns``) as a DataFrame; ValueError if it has no rows.

    With ``quiet=False`` a progress bar is drawn on stderr (when it is a terminal).
    """
    import pandas as pd

    from .progress import Progress

    chunks, total, unit = iter_chunks(path, columns, chunksize=200_000)
    frames = []
    with Progress(total, "read", unit=unit, quiet=quiet) as bar:
        for frame, _, position in chunks:
            frames.append(frame)
            bar.update(position=position)
    frame = pd.concat(frames, ignore_index=True) if frames else None
    if frame is None or len(frame) == 0:
        raise ValueError(f"{path}: no data rows (only a header)")
    return frame


def _where(source, fmt, row0: int) -> str:
    """Where 0-based data row ``row0`` is: data rows count from 1 after the header."""
    if fmt == "csv":
        return f"{source}: data row {row0 + 1} (line {row0 + 2} of the file)"
    return f"{source}: row {row0 + 1}"


def numeric_block(frame, columns, *, first_row=0, source="data", fmt="csv", on_nan="error"):
    """The ``columns`` of ``frame`` as a float64 array, and the rows to keep.

    Text in a column raises a ValueError naming the data row (1-based, after
    the header; for CSV also the file line, assuming one line per row) and the
    column. A missing or infinite value raises likewise when
    ``on_nan="error"``; with ``on_nan="drop"`` its row is marked False in
    the returned mask.

    Returns
    -------
    values : ndarray (len(frame), len(columns)), float64
    keep : ndarray of bool (len(frame),)
    """
    import pandas as pd

    if on_nan not in ("error", "drop"):
        raise ValueError(f"on_nan must be 'error' or 'drop', got {on_nan!r}")
    out = np.empty((len(frame), len(columns)), dtype=np.float64)
    for j, col in enumerate(columns):
        series = frame[col]
        if series.dtype.kind in "biuf":
            out[:, j] = series.to_numpy(dtype=np.float64, na_value=np.nan)
            continue
        values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        text = np.isnan(values) & series.notna().to_numpy()
        if text.any():
            i = int(np.argmax(text))
            raise ValueError(
                f"{_where(source, fmt, first_row + i)}: column {col!r} holds "
                f"{series.iloc[i]!r}, which is not a number"
            )
        out[:, j] = values
    finite = np.isfinite(out)
    keep = finite.all(axis=1)
    if on_nan == "error" and not keep.all():
        i = int(np.argmin(keep))
        col = columns[int(np.argmin(finite[i]))]
        raise ValueError(
            f"{_where(source, fmt, first_row + i)}: column {col!r} is missing or not finite "
            f"({out[i, columns.index(col)]}); use --on-nan drop to skip such rows"
        )
    return out, keep


def check_labels(frame, column, *, first_row=0, source="data", fmt="csv", on_nan="error"):
    """Rows whose label in ``column`` is present (for classifier targets)."""
    missing = frame[column].isna().to_numpy()
    if on_nan == "error" and missing.any():
        i = int(np.argmax(missing))
        raise ValueError(
            f"{_where(source, fmt, first_row + i)}: column {column!r} is missing; "
            "use --on-nan drop to skip such rows"
        )
    return ~missing


class TableWriter:
    """Append DataFrames to a CSV or Parquet file (format by ``fmt``).

    CSV: a header, then the rows of every chunk (floats at full precision).
    Parquet: one row group per chunk with the schema of the first chunk.
    """

    def __init__(self, path, fmt):
        self.path = Path(path)
        self.fmt = fmt
        self.rows = 0
        self._fh = None
        self._writer = None
        self._schema = None

    def write(self, frame) -> None:
        if self.fmt == "csv":
            if self._fh is None:
                self._fh = open(self.path, "w", newline="", encoding="utf-8")  # noqa: SIM115
                frame.to_csv(self._fh, index=False)
            else:
                frame.to_csv(self._fh, index=False, header=False)
        else:
            import pyarrow as pa

            pq = _pyarrow_parquet()
            try:
                table = pa.Table.from_pandas(frame, schema=self._schema, preserve_index=False)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise ValueError(
                    f"rows {self.rows + 1}-{self.rows + len(frame)} do not fit the Parquet "
                    f"schema of the first chunk ({exc}); a column changed type between chunks "
                    "- try a larger --chunksize or a CSV output"
                ) from exc
            if self._writer is None:
                self._schema = table.schema
                self._writer = pq.ParquetWriter(self.path, table.schema)
            self._writer.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
