"""Model files, and tables read and written in chunks.

Model files (``nbattn.save`` / ``nbattn.load``)
-----------------------------------------------
One ``.npz`` archive of uncompressed (stored) ``.npy`` members that never
holds pickled objects, so loading cannot execute code. Format
``"nbattn-model"``, version :data:`FORMAT_VERSION` (2):

* member ``__nbattn__``: a 0-d unicode array with the JSON metadata::

      {"format": "nbattn-model", "format_version": 2,
       "nbattn_version": "0.1.0", "estimator": "NadarayaWatsonRegressor",
       "params": {...get_params()...},
       "feature_names": ["income"] or null,
       "attributes": {"bandwidth_": {"kind": "array", "dtype": "<f8", "shape": [1],
                                     "object": false, "scalar": false},
                      "n_features_in_": {"kind": "json", "value": 1}, ...},
       "user": {...},                      # free JSON from save(metadata=...)
       "sha256": "<hex digest>"}

* member ``attr__<name>`` for every attribute of kind ``"array"``.

The fitted state is every instance attribute whose name ends in ``_`` (the
scikit-learn convention) plus private ones (one leading ``_``) holding a
number, a string or an array. Arrays (numeric, bool or str; an object array
of str, like ``feature_names_in_``, is stored as str and restored as object)
go into the archive; Python scalars, strings, None and lists of them go into
the JSON. ``sha256`` is the SHA-256 of the canonical JSON of the metadata
without that key, followed by each array's name, dtype, shape and bytes in
name order.

Reading trusts nothing: sizes first (members stored and inside the file,
metadata at most :data:`MAX_METADATA_BYTES`, every ``.npy`` header equal to
the dtype and shape the metadata declares, with exactly their bytes), then
the checksum (accidents), then the estimator's own validation of what was
rebuilt (edits: ``nbattn.estimators.check_fitted_state``). Any failure, another
format version or an estimator class outside ``nbattn.estimators.__all__``
raises a :class:`ModelFileError` (a ValueError) that says which.

Tables
------
:func:`iter_chunks` reads CSV (pandas, in chunks; every row's field count
checked against the header) or Parquet (pyarrow, in record batches),
:func:`read_columns` refuses duplicated names, :func:`numeric_block` turns
chunk columns into float64 with errors that name the row and the column,
:func:`labels_from_text` types class labels independently of the chunking,
:class:`TableWriter` appends chunks to CSV or Parquet, and
:func:`atomic_output` makes the result appear under its name only when
everything was written (keeping an existing file's mode, writing through a
symbolic link).

This module imports no other part of nbattn at import time (the estimator
classes are looked up when a model file is read or written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ModelFileError",
    "TableWriter",
    "atomic_output",
    "check_columns",
    "check_labels",
    "check_not_input",
    "clip",
    "input_format",
    "iter_chunks",
    "labels_from_text",
    "load",
    "numeric_block",
    "output_format",
    "read_columns",
    "read_model_file",
    "read_table",
    "row_location",
    "save",
    "shorten",
]

FORMAT_NAME = "nbattn-model"
FORMAT_VERSION = 2
#: the metadata member is refused beyond this size, before it is read
MAX_METADATA_BYTES = 16 * 2**20
#: CSV chunks hold at most this many cells (rows x all columns of the file)
CSV_CHUNK_CELLS = 2**22
_ARRAY_KINDS = "biufcU"
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
    atomic rename) and is removed if the block raises, including on an
    interruption: a failed run leaves neither a partial output nor a stray
    file, and an existing ``path`` is untouched until the new one is complete.

    An existing output keeps its permission bits (a new one gets the umask's).
    An output that is a symbolic link is written through: the file it points
    to is replaced and the link stays.
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"output {str(path)!r} is a folder")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    tmp = None
    try:  # from mkstemp on, so that an interruption at any point removes the file
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=folder)
        os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
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
    if value.dtype.kind not in _ARRAY_KINDS:
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
                attributes[name] = {
                    "kind": "array",
                    "object": was_object,
                    "scalar": is_scalar,
                    "dtype": stored.dtype.str,
                    "shape": list(stored.shape),
                }
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


def _nbattn_version() -> str:
    """The installed distribution's version (read without importing the package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nbattn")
    except PackageNotFoundError:
        return "unknown"


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
        "nbattn_version": _nbattn_version(),
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
            np.savez(fh, **members)  # ZIP_STORED members: what read_model_file requires
    return path


class ModelFileError(ValueError):
    """A file that is not a readable nbattn model file of this format version."""


def _bad(path, why: str) -> ModelFileError:
    return ModelFileError(f"{path}: {why}")


def read_model_file(path):
    """Load a model file: ``(estimator, metadata dict)``.

    Sizes come first: the archive's directory, the metadata member (at most
    :data:`MAX_METADATA_BYTES`) and every array's ``.npy`` header are checked
    against the metadata and against the file's size on disk before any
    array is read, so a forged size or shape costs nothing (members must be
    stored uncompressed, as ``save`` writes them: no zip bombs). Then the
    checksum, and the rebuilt estimator is validated by
    ``nbattn.estimators.check_fitted_state`` (its parameters against the
    estimator's constraints, its fitted attributes' names, shapes and dtypes):
    the checksum detects accidents, the validation detects edits.

    Raises ValueError (:class:`ModelFileError`) for a file that is not an
    nbattn model file, one of another format version, a truncated, corrupted
    or edited one, or one naming an estimator class outside the whitelist.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
        disk_size = os.fstat(fh.fileno()).st_size
    if magic != b"PK\x03\x04":
        raise _bad(path, "not an nbattn model file (not an .npz archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = _archive_members(path, zf, disk_size)
            if _META + ".npy" not in infos:
                raise _bad(path, "not an nbattn model file (no nbattn metadata)")
            meta = _read_metadata(path, zf, infos[_META + ".npy"])
            declared = _declared_arrays(path, meta)
            extra = sorted(set(infos) - {_META + ".npy"} - {k + ".npy" for k in declared})
            if extra:
                raise _bad(path, f"member {extra[0]!r} is not described by the metadata")
            members = {}
            for key, (dtype, shape) in declared.items():
                if key + ".npy" not in infos:
                    raise _bad(path, f"array {key!r} is missing")
                members[key] = _read_member(path, zf, infos[key + ".npy"], dtype, shape)
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        raise _bad(path, f"truncated, corrupt or foreign model file ({_one_line(exc)})") from exc
    if meta.get("sha256") != _digest(meta, members):
        raise _bad(path, "checksum mismatch: the model file was modified or is corrupt")
    try:
        model = _rebuild(path, meta, members)
        _check_fitted_state(model)
    except ModelFileError:
        raise
    except (TypeError, AttributeError, ValueError) as exc:  # well-formed, wrong content
        raise _bad(path, f"invalid model: {_one_line(exc)}") from exc
    return model, meta


def _check_fitted_state(model) -> None:
    from .estimators import check_fitted_state

    check_fitted_state(model)


def _one_line(exc) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _archive_members(path, zf, disk_size) -> dict:
    """name -> ZipInfo, after checking that every member is a stored ``.npy`` whose
    declared extent lies inside the file."""
    infos = {}
    for info in zf.infolist():
        name = info.filename
        if name in infos:
            raise _bad(path, f"member {name!r} appears twice in the archive")
        if not name.endswith(".npy") or "/" in name:
            raise _bad(path, f"member {name!r} is not an array of a model file")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise _bad(path, f"member {name!r} is compressed; model files store arrays as they are")
        if info.header_offset + info.compress_size > disk_size:
            raise _bad(path, f"member {name!r} declares more bytes than the file holds")
        infos[name] = info
    return infos


def _read_metadata(path, zf, info) -> dict:
    if info.file_size > MAX_METADATA_BYTES:
        raise _bad(path, f"metadata of {info.file_size} bytes (at most {MAX_METADATA_BYTES})")
    raw = _read_member(path, zf, info, None, ())
    if raw.dtype.kind != "U":
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
            f"{meta.get('nbattn_version', '?')}); this nbattn reads version {FORMAT_VERSION}"
            + ("; fit and save the model again" if version == 1 else ""),
        )
    return meta


def _declared_arrays(path, meta) -> dict:
    """member key -> (dtype, shape) of every array the metadata describes."""
    attributes = meta.get("attributes")
    if not isinstance(attributes, dict):
        raise _bad(path, "invalid model description (attributes is not an object)")
    declared = {}
    for attr, info in attributes.items():
        if not isinstance(info, dict):
            raise _bad(path, f"invalid description of attribute {attr!r}")
        if info.get("kind") != "array":
            continue
        descr, shape = info.get("dtype"), info.get("shape")
        try:
            if not isinstance(descr, str) or not isinstance(shape, list):
                raise TypeError("dtype must be a string and shape a list")
            if not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
                raise TypeError("shape must hold integers")
            dtype, shape = np.dtype(descr), tuple(shape)
        except (TypeError, ValueError) as exc:
            raise _bad(path, f"attribute {attr!r}: no valid dtype and shape ({exc})") from exc
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or any(n < 0 for n in shape):
            raise _bad(path, f"attribute {attr!r}: dtype {dtype} and shape {shape} not allowed")
        declared[_PREFIX + attr] = (dtype, shape)
    return declared


def _read_member(path, zf, info, dtype, shape):
    """The array of one stored ``.npy`` member, its header checked against ``dtype``
    (None: any unicode dtype) and ``shape`` before the data is allocated and read."""
    fmt = np.lib.format
    name = info.filename
    with zf.open(info) as fh:
        version = fmt.read_magic(fh)
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        got_shape, fortran, got_dtype = read_header(fh)
        if got_dtype.hasobject:
            raise _bad(path, f"member {name!r} holds Python objects; model files never do")
        if (dtype is not None and got_dtype != dtype) or (dtype is None and got_dtype.kind != "U"):
            raise _bad(path, f"member {name!r} has dtype {got_dtype}, the metadata says {dtype}")
        if tuple(got_shape) != tuple(shape):
            raise _bad(path, f"member {name!r} has shape {got_shape}, the metadata says {shape}")
        count = math.prod(shape)
        if fh.tell() + count * got_dtype.itemsize != info.file_size:
            raise _bad(path, f"member {name!r} holds {info.file_size} bytes, not its shape's")
        flat = np.empty(count, dtype=got_dtype)
        if count and fh.readinto(flat.view(np.uint8)) != flat.nbytes:
            raise _bad(path, f"member {name!r} is truncated")
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


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
    for attr, info in meta["attributes"].items():
        if not attr.endswith("_") and not attr.startswith("_"):
            raise _bad(path, f"attribute name {attr!r} is not a fitted attribute")
        if attr in known or attr.startswith("__"):
            raise _bad(path, f"attribute name {attr!r} is not allowed")
        if info.get("kind") == "array":
            value = members[_PREFIX + attr]
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


_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _csv_error(path, exc) -> ValueError:
    import pandas as pd

    if isinstance(exc, pd.errors.EmptyDataError):
        return ValueError(f"{path}: the file is empty")
    fields = _FIELDS.search(str(exc))
    if fields:
        want, line, saw = fields.groups()
        return ValueError(f"{path}: line {line} has {saw} fields; the header has {want}")
    return ValueError(f"{path}: cannot read as CSV: {clip(' '.join(str(exc).split()), 300)}")


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}...{text[-8:]} ({len(text)} characters)"


def shorten(value, limit: int = 60) -> str:
    """``repr(value)`` clipped to about ``limit`` characters: a cell or a name quoted in an
    error message, which must stay one readable line whatever the file holds."""
    return clip(repr(value), limit)


def _exact_floats() -> dict:
    """read_csv options that parse floats exactly (pandas 3 does by default; 2.x needs
    ``float_precision="round_trip"``, which pandas 3 deprecates)."""
    import pandas as pd

    major = int(pd.__version__.split(".")[0])
    return {} if major >= 3 else {"float_precision": "round_trip"}


def read_columns(path) -> list[str]:
    """The column names of a CSV or Parquet file (reads the header only).

    A name that appears twice is an error (pandas would rename the second
    ``x.1`` and a command would silently read the first).
    """
    import pandas as pd

    path = Path(path)
    if input_format(path) == "parquet":
        pq = _pyarrow_parquet()
        try:
            names = list(pq.read_schema(path).names)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: cannot read as Parquet: {exc}") from exc
        _check_unique(path, names)
        return names
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        raw = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
        names = [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except (ValueError, pd.errors.ParserError) as exc:
        raise _csv_error(path, exc) from exc
    _check_unique(path, [c for c in raw.iloc[0].tolist() if c != ""])
    return names


def _check_unique(path, names) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{path}: the column name {shorten(name)} appears more than once")
        seen.add(name)


def check_not_input(inputs, output) -> None:
    """ValueError when ``output`` is (the same file as) one of ``inputs``."""
    for path in inputs:
        if os.path.exists(output) and os.path.exists(path) and os.path.samefile(path, output):
            raise ValueError(f"the output {str(output)!r} is an input file; choose another name")


def check_columns(path, columns, wanted, what="column") -> None:
    """ValueError naming the first of ``wanted`` that is not in ``columns``."""
    missing = [c for c in wanted if c not in columns]
    if missing:
        shown = ", ".join(shorten(c) for c in columns[:20])
        more = " ..." if len(columns) > 20 else ""
        raise ValueError(
            f"{path}: {what} {shorten(missing[0])} not found; the columns are {shown}{more}"
        )


def iter_chunks(path, columns=None, chunksize=100_000, *, text_columns=()):
    """Read a CSV or Parquet file in chunks.

    Returns ``(chunks, total, unit)``: ``chunks`` yields
    ``(frame, first_row, position)`` with ``first_row`` the 0-based data row
    of the chunk's first row and ``position`` the progress so far in
    ``unit`` ("bytes" for CSV, "rows" for Parquet) out of ``total``.
    Only ``columns`` are returned (all when None). CSV columns in
    ``text_columns`` are read as text, so their type does not depend on where
    a chunk starts (pandas infers each chunk's types on its own).

    Every CSV row is checked against the header: a row with more fields than
    the header is an error naming its line (it is not silently cut).
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
    # All columns are parsed: usecols would turn off pandas' field count check. So
    # that memory stays bounded for wide files, a chunk holds at most CSV_CHUNK_CELLS.
    width = max(1, len(read_columns(path)))
    options = {
        "index_col": False,  # never take the first column as an index when rows are longer
        "chunksize": max(1, min(chunksize, CSV_CHUNK_CELLS // width)),
        "dtype": {c: str for c in text_columns} or None,
        **_exact_floats(),
    }

    def parse(step):
        """``step()`` with pandas' ParserWarning (a first data row longer than the header)
        as an error; the filter is set around each read only, never across a yield."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pd.errors.ParserWarning)
                return step()
        except pd.errors.ParserWarning:
            raise ValueError(f"{path}: line 2 has more fields than the header") from None
        except (ValueError, pd.errors.ParserError) as exc:
            raise _csv_error(path, exc) from exc

    def csv_chunks():
        with open(path, "rb") as fh, parse(lambda: pd.read_csv(fh, **options)) as reader:
            row = 0
            while (frame := parse(lambda: next(reader, None))) is not None:
                yield (frame if columns is None else frame[columns]), row, fh.tell()
                row += len(frame)

    return csv_chunks(), total, "bytes"


def read_table(path, columns=None, *, quiet=True, text_columns=()):
    """The whole file (only ``columns``) as a DataFrame; ValueError if it has no rows.

    ``text_columns`` as for :func:`iter_chunks`. With ``quiet=False`` a
    progress bar is drawn on stderr (when it is a terminal).
    """
    import pandas as pd

    from .progress import Progress

    chunks, total, unit = iter_chunks(path, columns, 200_000, text_columns=text_columns)
    frames = []
    with Progress(total, "read", unit=unit, quiet=quiet) as bar:
        for frame, _, position in chunks:
            frames.append(frame)
            bar.update(position=position)
    frame = pd.concat(frames, ignore_index=True) if frames else None
    if frame is None or len(frame) == 0:
        raise ValueError(f"{path}: no data rows (only a header)")
    return frame


def row_location(source, fmt, row0: int) -> str:
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
                f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} holds "
                f"{shorten(series.iloc[i])}, which is not a number"
            )
        out[:, j] = values
    finite = np.isfinite(out)
    keep = finite.all(axis=1)
    if on_nan == "error" and not keep.all():
        i = int(np.argmin(keep))
        col = columns[int(np.argmin(finite[i]))]
        raise ValueError(
            f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} is missing or "
            f"not finite ({out[i, columns.index(col)]}); use --on-nan drop to skip such rows"
        )
    return out, keep


def check_labels(frame, column, *, first_row=0, source="data", fmt="csv", on_nan="error"):
    """Rows whose label in ``column`` is present (for classifier targets)."""
    missing = frame[column].isna().to_numpy()
    if on_nan == "error" and missing.any():
        i = int(np.argmax(missing))
        raise ValueError(
            f"{row_location(source, fmt, first_row + i)}: column {shorten(column)} is missing; "
            "use --on-nan drop to skip such rows"
        )
    return ~missing


_INTEGER = re.compile(r"[+-]?\d+")


def labels_from_text(values, classes=None):
    """Class labels read as text (a CSV column read with ``text_columns``), typed by one
    rule that does not depend on how the file was chunked.

    Without ``classes`` (fitting): integers when every label is written as
    one, else the text. With the fitted model's ``classes``: integers or
    floats where the classes are (labels that do not parse stay text, and are
    reported as unknown classes), else the text. Values that are not text
    (Parquet columns carry their type) are returned as they are.
    """
    values = np.asarray(values, dtype=object)
    if not all(isinstance(v, str) for v in values):
        return values
    kind = None if classes is None else np.asarray(classes).dtype.kind
    if kind is None:
        if len(values) and all(_INTEGER.fullmatch(v.strip()) for v in values):
            return np.array([int(v) for v in values])
        return values
    if kind in "iu":
        return np.array([int(v) if _INTEGER.fullmatch(v.strip()) else v for v in values], object)
    if kind == "f":
        return np.array([_float_or_text(v) for v in values], dtype=object)
    return values


def _float_or_text(text):
    try:
        return float(text)
    except ValueError:
        return text


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
