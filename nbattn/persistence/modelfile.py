"""Model files: ``nbattn.save`` / ``nbattn.load``.

One ``.npz`` archive of uncompressed (stored) ``.npy`` members that never
holds pickled objects, so loading cannot execute code. Format
``"nbattn-model"``, version :data:`FORMAT_VERSION` (4; files of versions 2
and 3 still load):

* member ``__nbattn__``: a 0-d unicode array with the JSON metadata::

      {"format": "nbattn-model", "format_version": 4,
       "nbattn_version": "0.1.0", "estimator": "NadarayaWatsonRegressor",
       "params": {...get_params()...},
       "params_not_saved": {"random_state": "Generator"},   # saved as null (not JSON)
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
the JSON: a table's column kinds ``var_type_`` ("cuo" letters) and its
``categories_`` (per column null or the list of category strings or
numbers, code k being entry k) are plain JSON, so the encoding needs no
pickle. Version 3 added those two and ``sample_weight_``; a version-2 file
(all columns continuous, unweighted) is read with ``var_type_`` all "c",
``categories_`` all null and ``sample_weight_`` null. Version 4 added a
classifier's ``prior_count_`` (the prior of the class frequencies in its probabilities);
a classifier of version 2 or 3 is read with 0, the plain probabilities it
predicted then. The density estimators (``KernelDensity``, ``ConditionalKernelDensity``,
``KernelQuantileRegressor``) are held by the same version-4 format, unchanged: their
fitted state is of the kinds above (a conditional model's ``y_fit_`` an (n,) array of y
or of its category codes, ``y_type_`` a letter, ``y_categories_`` null or a JSON list,
``y_bandwidth_`` a JSON number); a reader that predates them refuses such a file as one
of an estimator it does not know. ``sha256`` is the
SHA-256 of the canonical JSON of the metadata without that key, followed
by each array's name, dtype, shape and bytes in name order.

Reading trusts nothing: sizes first (members stored and inside the file,
metadata at most :data:`MAX_METADATA_BYTES`, every ``.npy`` header equal to
the dtype and shape the metadata declares, with exactly their bytes), then
the checksum (accidents), then the parameters against the estimators' specs
(``degree=True`` is no degree) and the estimator's own validation of what was
rebuilt (edits: :func:`nbattn.estimators.check_fitted_state`: among others each
column's categories distinct under the encoding's rule, of one kind, no NaN, and
each lambda inside its kernel's domain). The file must end where its archive
ends, and ``format_version`` be an integer this reader knows. Any failure, another
format version or an estimator class outside :data:`nbattn.estimators.spec.SPECS`
raises a :class:`ModelFileError` (a ValueError) that says which.

Two readers share those checks: :func:`read_model_file` (and :func:`load`)
rebuild the scikit-learn estimator; :func:`read_fitted_state` returns the
plain content (metadata and fitted attributes by name) without importing
scikit-learn, for :mod:`nbattn.persistence.predictor`, which validates it with
:func:`nbattn.estimators.fitted_state.check_fitted_state` (the same checks as the
estimator's) and predicts the same numbers: ``nbattn predict`` reads model
files that way.

This module imports no other part of nbattn at import time (the estimator
classes are looked up, and :func:`nbattn._core.atomic.atomic_output` imported, when a
model file is read or written).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_METADATA_BYTES",
    "READABLE_VERSIONS",
    "ModelFileError",
    "load",
    "invalid_model",
    "read_fitted_state",
    "read_model_file",
    "save",
]

FORMAT_NAME = "nbattn-model"
FORMAT_VERSION = 4
#: older versions this nbattn still reads (see _upgrade)
READABLE_VERSIONS = (2, 3, 4)
#: the metadata member is refused beyond this size, before it is read
MAX_METADATA_BYTES = 16 * 2**20
_ARRAY_KINDS = "biufcU"
_META = "__nbattn__"
_PREFIX = "attr__"
_JSON_SCALARS = (bool, int, float, str, type(None))


def _estimator_classes() -> dict:
    """The whitelist: the classes of :mod:`nbattn.estimators` that have a spec
    (:data:`nbattn.estimators.spec.SPECS`), by name."""
    from .. import estimators
    from ..estimators.spec import SPECS

    return {name: getattr(estimators, name) for name in SPECS}


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


def _saved_params(model):
    """(JSON parameters, {name: type} of those saved as null).

    The parameters its spec says model files save (:class:`nbattn.estimators.spec.Param`).
    A random generator (``np.random.Generator`` or ``RandomState``) holds state
    that JSON cannot carry; it only seeds a fit, never a prediction, so it is
    saved as null and its type recorded under ``params_not_saved``.
    """
    saved = {p.name for p in model._spec.params if p.saved}
    params, not_saved = {}, {}
    for k, v in model.get_params(deep=False).items():
        if k not in saved:
            continue
        if isinstance(v, (np.random.Generator, np.random.RandomState)):
            params[k], not_saved[k] = None, type(v).__name__
        else:
            params[k] = _jsonable(v, f"parameter {k!r}")
    return params, not_saved


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
    from ..estimators.fitted_state import RESULT_ATTRIBUTES

    params = set(model.get_params(deep=False))
    arrays, attributes = {}, {}
    for name, value in sorted(vars(model).items()):
        public = name.endswith("_") and not name.startswith("_")
        private = name.startswith("_") and not name.startswith("__")
        if name in params or name in RESULT_ATTRIBUTES or not (public or private):
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

    The format is documented in :mod:`nbattn.app.io` (version
    :data:`FORMAT_VERSION`); it holds no pickled objects. The file is written
    to a temporary name and renamed, so ``path`` is never left half-written.

    Parameters
    ----------
    model : a fitted estimator of :mod:`nbattn.estimators`
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
    params, not_saved = _saved_params(model)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "nbattn_version": _nbattn_version(),
        "estimator": name,
        "params": params,
        "params_not_saved": not_saved,
        "feature_names": None if names is None else [str(n) for n in names],
        "attributes": attributes,
        "user": _jsonable(metadata or {}, "metadata"),
    }
    meta["sha256"] = _digest(meta, arrays)
    members = {_META: np.array(json.dumps(meta, sort_keys=True)), **arrays}
    from .._core.atomic import atomic_output

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
    :func:`nbattn.estimators.check_fitted_state` (its parameters against the
    estimator's constraints, its fitted attributes' names, shapes and dtypes):
    the checksum detects accidents, the validation detects edits.

    Raises ValueError (:class:`ModelFileError`) for a file that is not an
    nbattn model file, one of another format version, a truncated, corrupted
    or edited one, or one naming an estimator class outside the whitelist.
    """
    path = Path(path)
    meta, members = _read_checked(path)
    try:
        model = _rebuild(path, meta, members)
        _check_fitted_state(model)
    except ModelFileError:
        raise
    except (TypeError, AttributeError, ValueError) as exc:  # well-formed, wrong content
        raise invalid_model(path, exc) from exc
    return model, meta


def read_fitted_state(path):
    """A model file's content without building the estimator: ``(metadata, attributes)``.

    The same checks as :func:`read_model_file` up to the checksum (sizes,
    headers, format version, SHA-256), then the fitted attributes decoded as
    the estimator would hold them (``{name: value}``, object arrays of str
    restored, a version-2 file upgraded). The parameters are
    ``metadata["params"]``, the class name ``metadata["estimator"]``; neither
    is validated here (:func:`nbattn.estimators.fitted_state.check_fitted_state` does it).
    Imports nothing beyond NumPy: :mod:`nbattn.persistence.predictor` reads model files
    with it without loading scikit-learn.

    Raises :class:`ModelFileError` (a ValueError) as :func:`read_model_file`.
    """
    path = Path(path)
    meta, members = _read_checked(path)
    attributes = _decoded_attributes(path, meta, members)
    _upgrade(attributes, meta.get("format_version"))
    return meta, attributes


def invalid_model(path, exc) -> ModelFileError:
    """The error for a well-formed model file whose content ``exc`` refuses."""
    return _bad(path, f"invalid model: {_one_line(exc)}")


def _read_checked(path):
    """(metadata, arrays by member name) after the size, header and checksum checks."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
        disk_size = os.fstat(fh.fileno()).st_size
    if magic != b"PK\x03\x04":
        raise _bad(path, "not an nbattn model file (not an .npz archive)")
    _check_archive_end(path, disk_size)
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
    return meta, members


def _check_archive_end(path, disk_size) -> None:
    """The file is one archive from its first byte to its last: it ends with the
    end-of-central-directory record (22 bytes, ``save`` writes no archive comment), and the
    central directory that record points to (its offset from the archive's start, plus its
    size) ends just before it. Bytes after the archive (a file appended to) or before it
    (two files joined, a prefix) are refused: a reader searching backwards would skip
    them, or take the last of two joined archives."""
    if disk_size < 22:
        raise _bad(path, "truncated, corrupt or foreign model file (too short)")
    with open(path, "rb") as fh:
        fh.seek(disk_size - 22)
        tail = fh.read(22)
    if tail[:4] != b"PK\x05\x06" or tail[20:22] != b"\x00\x00":
        with open(path, "rb") as fh:
            whole = fh.read()
        if whole[:4] == b"PK\x03\x04" and b"PK\x05\x06" not in whole:
            raise _bad(
                path,
                "truncated model file: it is cut short (no end of archive: an interrupted "
                "copy, download or save); copy or save it again",
            )
        raise _bad(
            path,
            "bytes after the end of the archive (or an archive comment): the file was "
            "appended to or is not a model file as nbattn.save writes it",
        )
    size_cd = int.from_bytes(tail[12:16], "little")
    offset_cd = int.from_bytes(tail[16:20], "little")
    if 0xFFFFFFFF not in (size_cd, offset_cd) and offset_cd + size_cd != disk_size - 22:
        raise _bad(
            path,
            "bytes before the archive (two model files joined, or a prefix): the file is "
            "not a model file as nbattn.save writes it",
        )


def _check_fitted_state(model) -> None:
    from ..estimators import check_fitted_state

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
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise _bad(
            path,
            f"model file format version {version!r} (written by nbattn "
            f"{meta.get('nbattn_version', '?')}); this nbattn reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
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


def _decoded_attributes(path, meta, members) -> dict:
    """{name: value} of the fitted attributes the metadata describes (names checked:
    a trailing ``_`` or one leading ``_``)."""
    attributes = {}
    for attr, info in meta["attributes"].items():
        if not attr.endswith("_") and not attr.startswith("_"):
            raise _bad(path, f"attribute name {attr!r} is not a fitted attribute")
        if attr.startswith("__"):
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
        attributes[attr] = value
    return attributes


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
    from ..estimators.fitted_state import check_params

    try:  # the spec's rules: stricter than scikit-learn's (degree=True is no degree)
        check_params(name, params)
    except ValueError as exc:
        raise invalid_model(path, exc) from exc
    model = cls(**params)
    attributes = _decoded_attributes(path, meta, members)
    clash = sorted(set(attributes) & known)
    if clash:
        raise _bad(path, f"attribute name {clash[0]!r} is not allowed")
    for attr, value in attributes.items():
        setattr(model, attr, value)
    _upgrade(vars(model), meta.get("format_version"))
    return model


def _upgrade(attributes: dict, version) -> None:
    """Fill in what a file of an older version did not hold (``attributes``: the
    fitted attributes by name, an estimator's ``vars``).

    Version 2 predates tables: every column was continuous and fits were
    unweighted, which is what these values say. Versions 2 and 3 predate a
    classifier's prior: its probabilities were the plain ones (weight 0).
    """
    if version in (2, 3) and "classes_" in attributes:
        attributes.setdefault("prior_count_", 0.0)
    if version == 2:
        d = attributes.get("n_features_in_")
        if isinstance(d, int) and not isinstance(d, bool) and d >= 1:
            attributes.setdefault("var_type_", "c" * d)
            attributes.setdefault("categories_", [None] * d)
        attributes.setdefault("sample_weight_", None)


def load(path):
    """Read an estimator written by :func:`save` (no code is executed).

    Raises ValueError for a foreign, truncated, edited or other-version file.
    """
    return read_model_file(path)[0]
