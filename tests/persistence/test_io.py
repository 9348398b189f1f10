"""Model files (nbattn.save / nbattn.load), atomic output, chunked tables, progress."""

import io as pyio
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError

import nbattn
from nbattn._core.progress import Progress, running
from nbattn.app import io
from nbattn.persistence import modelfile

from ..strategies import seeds


def _data(rng, n=40, d=2):
    X = pd.DataFrame(rng.normal(size=(n, d)), columns=[f"f{j}" for j in range(d)])
    y = np.sin(X.to_numpy()).sum(axis=1) + 0.1 * rng.normal(size=n)
    return X, y


def _members(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _rewrite(path, meta, arrays, digest=True):
    """Write a model file by hand (to test what load does with foreign content)."""
    meta = dict(meta)
    if digest:
        meta["sha256"] = modelfile._digest(meta, arrays)
    with open(path, "wb") as fh:
        np.savez(fh, __nbattn__=np.array(json.dumps(meta)), **arrays)


def _split(path):
    members = _members(path)
    meta = json.loads(str(members.pop("__nbattn__")))
    return meta, members


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"bandwidth": 0.7},
        {"bandwidth": [0.5, 2.0]},
        {"kernel": "average"},
        {"dtype": "float32"},
    ],
)
def test_round_trip_predicts_identically(tmp_path, rng, params):
    X, y = _data(rng)
    model = nbattn.NadarayaWatsonRegressor(**params).fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    loaded = nbattn.load(path)
    assert type(loaded) is type(model)
    assert loaded.get_params() == model.get_params() or params.get("bandwidth") == [0.5, 2.0]
    Xq = pd.DataFrame(rng.normal(size=(15, 2)), columns=X.columns)
    np.testing.assert_array_equal(loaded.predict(Xq), model.predict(Xq))
    np.testing.assert_array_equal(loaded.bandwidth_, model.bandwidth_)
    assert loaded.feature_names_in_.dtype == object
    assert list(loaded.feature_names_in_) == list(model.feature_names_in_)
    assert loaded.n_features_in_ == model.n_features_in_


def test_round_trip_multioutput_and_private_state(tmp_path, rng):
    X = rng.normal(size=(30, 3))
    Y = rng.normal(size=(30, 2))
    model = nbattn.NadarayaWatsonRegressor(bandwidth="silverman").fit(X, Y)
    loaded = nbattn.load(nbattn.save(model, tmp_path / "m.npz"))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.predict(X).shape == (30, 2)
    assert not hasattr(loaded, "feature_names_in_")
    state = {k: v for k, v in vars(model).items() if k.endswith("_") or k.startswith("_")}
    assert state and set(state) <= set(vars(loaded))
    for key, value in state.items():
        np.testing.assert_array_equal(getattr(loaded, key), value)
        assert type(getattr(loaded, key)) is type(value)


def test_attribute_that_is_not_a_fitted_attribute_is_refused(tmp_path, rng):
    # needs nbattn.estimators.check_fitted_state (it knows each estimator's attributes)
    X, y = _data(rng)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    model.extra_ = np.arange(4, dtype=np.int32)
    path = nbattn.save(model, tmp_path / "m.npz")
    with pytest.raises(ValueError, match="extra_"):
        nbattn.load(path)


def test_file_holds_no_pickle_and_documents_itself(tmp_path, rng):
    X, y = _data(rng)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz", metadata={"target": "y"})
    meta, arrays = _split(path)  # np.load with allow_pickle=False reads every member
    assert all(a.dtype.kind != "O" for a in arrays.values())
    assert meta["format"] == "nbattn-model" and meta["format_version"] == io.FORMAT_VERSION
    assert meta["estimator"] == "NadarayaWatsonRegressor"
    assert meta["nbattn_version"] == nbattn.__version__
    assert meta["feature_names"] == ["f0", "f1"]
    assert meta["user"] == {"target": "y"}
    assert meta["params"] == model.get_params()
    fitted = [k for k in vars(model) if k.endswith("_") and k not in model.get_params()]
    assert {"X_fit_", "y_fit_", "bandwidth_", "n_features_in_"} <= set(fitted)
    assert set(fitted) <= set(meta["attributes"])
    with zipfile.ZipFile(path) as zf:
        assert all(n.endswith(".npy") for n in zf.namelist())


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("LearnedKernelRegressor", {"metric": "scalar"}),
        ("LearnedKernelRegressor", {"metric": "diagonal"}),
        ("LearnedKernelRegressor", {"metric": "full"}),
        ("NadarayaWatsonClassifier", {}),
    ],
)
def test_round_trip_other_estimators(tmp_path, rng, name, kwargs):
    cls = getattr(nbattn, name)
    X, y = _data(rng, n=40, d=2)
    if name.endswith("Classifier"):
        y = np.where(y > np.median(y), "high", "low")
    model = cls(**kwargs).fit(X, y)
    loaded = nbattn.load(nbattn.save(model, tmp_path / "m.npz"))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    if hasattr(model, "predict_proba"):
        np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


# ----------------------------------------------------------------------------- refusals


@pytest.fixture
def saved(tmp_path, rng):
    X, y = _data(rng)
    return nbattn.save(nbattn.NadarayaWatsonRegressor().fit(X, y), tmp_path / "m.npz")


@pytest.mark.parametrize("version, advice", [(5, ""), (1, "; fit and save the model again")])
def test_other_format_version_is_refused(saved, version, advice):
    meta, arrays = _split(saved)
    meta["format_version"] = version
    _rewrite(saved, meta, arrays)
    with pytest.raises(
        ValueError, match=rf"format version {version}.*reads versions 2, 3, 4{advice}$"
    ):
        nbattn.load(saved)


def test_version_2_file_still_loads(tmp_path, rng):
    """A file written before tables (no column kinds, categories or weights) loads as
    an all-continuous, unweighted model and predicts what it predicted."""
    X, y = _data(rng)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    meta, arrays = _split(path)
    meta["format_version"] = 2
    for name in ("var_type_", "categories_", "sample_weight_"):
        del meta["attributes"][name]
    for name in ("var_type", "missing", "handle_unknown"):
        del meta["params"][name]
    _rewrite(path, meta, arrays)
    loaded = nbattn.load(path)
    assert loaded.var_type_ == "cc" and loaded.categories_ == [None, None]
    assert loaded.sample_weight_ is None
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


def test_mixed_table_round_trip_keeps_categories_as_json(tmp_path):
    """Category encodings are saved as JSON lists (no pickle) and predictions survive."""
    rng = np.random.default_rng(3)
    n = 60
    frame = pd.DataFrame(
        {
            "x": rng.normal(size=n),
            "colour": rng.choice(["red", "green", "blue"], n),
            "grade": pd.Categorical(
                rng.choice(["low", "mid", "high"], n), ["low", "mid", "high"], ordered=True
            ),
            "flag": rng.random(n) < 0.5,
        }
    )
    y = frame.x + (frame.colour == "red") + frame.grade.cat.codes + rng.normal(0, 0.1, n)
    for model in (
        nbattn.LocalPolynomialRegressor(bandwidth="scott"),
        nbattn.NadarayaWatsonRegressor(handle_unknown="ignore"),
    ):
        model.fit(frame, y, sample_weight=rng.integers(1, 3, n))
        path = nbattn.save(model, tmp_path / "m.npz")
        meta, arrays = _split(path)
        assert meta["attributes"]["categories_"] == {
            "kind": "json",
            "value": [None, ["blue", "green", "red"], ["low", "mid", "high"], [False, True]],
        }
        assert meta["attributes"]["var_type_"]["value"] == "cuou"
        loaded = nbattn.load(path)
        np.testing.assert_array_equal(loaded.predict(frame), model.predict(frame))


def test_truncated_file_is_refused(saved):
    data = saved.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 100):
        saved.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated|corrupt"):
            nbattn.load(saved)


def test_file_cut_before_its_end_of_archive_says_so(saved):
    """A copy or download stopped before the archive's end record: "cut short", not
    "appended to" (the record is nowhere in the file)."""
    data = saved.read_bytes()
    end = data.rfind(b"PK\x05\x06")
    for cut in (len(data) // 2, end - 1, 100):
        saved.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="cut short"):
            nbattn.load(saved)


def test_flipped_byte_is_refused(saved):
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as zf:
        info = zf.getinfo("attr__y_fit_.npy")
    # a byte of the array data: after the zip local header (30 bytes, the name, the extra
    # field) and the .npy header (a multiple of 64 bytes; 128 for these small arrays)
    extra = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    pos = info.header_offset + 30 + len(info.filename) + extra + 128 + 3
    assert pos < info.header_offset + 30 + len(info.filename) + extra + info.compress_size
    data[pos] ^= 0xFF
    saved.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt|checksum"):
        nbattn.load(saved)


def test_edited_array_fails_the_checksum(saved):
    meta, arrays = _split(saved)
    arrays["attr__y_fit_"] = arrays["attr__y_fit_"] + 1.0
    _rewrite(saved, meta, arrays, digest=False)  # a valid archive with the old digest
    with pytest.raises(ValueError, match="checksum"):
        nbattn.load(saved)


def test_edited_metadata_fails_the_checksum(saved):
    meta, arrays = _split(saved)
    meta["params"]["bandwidth"] = 3.0
    _rewrite(saved, meta, arrays, digest=False)
    with pytest.raises(ValueError, match="checksum"):
        nbattn.load(saved)


@pytest.mark.parametrize("estimator", ["LinearRegression", "os.system", "Popen"])
def test_foreign_estimator_name_is_refused(saved, estimator):
    meta, arrays = _split(saved)
    meta["estimator"] = estimator
    _rewrite(saved, meta, arrays)
    with pytest.raises(ValueError, match="not available"):
        nbattn.load(saved)


def test_unknown_parameter_and_bad_attribute_names_are_refused(saved):
    meta, arrays = _split(saved)
    bad = dict(meta, params={**meta["params"], "evil": 1})
    _rewrite(saved, bad, arrays)
    with pytest.raises(ValueError, match="not parameters"):
        nbattn.load(saved)
    bad = dict(meta, attributes={**meta["attributes"], "predict": {"kind": "json", "value": 1}})
    _rewrite(saved, bad, arrays)
    with pytest.raises(ValueError, match="not a fitted attribute"):
        nbattn.load(saved)


class _Boom:
    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return (open, (self.flag, "w"))


def test_pickled_payload_is_never_executed(saved, tmp_path):
    flag = tmp_path / "executed"
    meta, arrays = _split(saved)
    arrays["attr__X_fit_"] = np.array([_Boom(str(flag))], dtype=object)  # pickled by np.savez
    _rewrite(saved, meta, arrays, digest=False)
    with pytest.raises(ValueError):
        nbattn.load(saved)
    assert not flag.exists()


@pytest.mark.parametrize(
    "content",
    [b"", b"x,y\n1,2\n", b"PK\x03\x04garbage", b"\x93NUMPY not really"],
)
def test_foreign_files_are_refused(tmp_path, content):
    path = tmp_path / "m.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="model file"):
        nbattn.load(path)


def test_npz_without_metadata_is_refused(tmp_path):
    path = tmp_path / "m.npz"
    np.savez(path, a=np.arange(3))
    with pytest.raises(ValueError, match="no nbattn metadata"):
        nbattn.load(path)


def test_save_refuses_foreign_and_unfitted_estimators(tmp_path, rng):
    from sklearn.linear_model import LinearRegression

    X, y = _data(rng)
    with pytest.raises(ValueError, match="nbattn estimators only"):
        nbattn.save(LinearRegression().fit(X, y), tmp_path / "m.npz")
    with pytest.raises(NotFittedError):
        nbattn.save(nbattn.NadarayaWatsonRegressor(), tmp_path / "m.npz")
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    model.weird_ = {1: object()}
    with pytest.raises(ValueError, match="weird_"):
        nbattn.save(model, tmp_path / "m.npz")
    assert os.listdir(tmp_path) == []


def test_failed_save_leaves_nothing_and_keeps_the_old_file(tmp_path, rng, monkeypatch):
    X, y = _data(rng)
    model = nbattn.NadarayaWatsonRegressor().fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fail)
    with pytest.raises(OSError, match="disk full"):
        nbattn.save(model, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.npz"]


# ----------------------------------------------------------------------------- atomic output


def test_atomic_output(tmp_path):
    target = tmp_path / "out.txt"
    with io.atomic_output(target) as tmp:
        assert tmp.parent == tmp_path and not target.exists()
        tmp.write_text("done")
    assert target.read_text() == "done"
    assert os.listdir(tmp_path) == ["out.txt"]
    with pytest.raises(RuntimeError), io.atomic_output(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("fail")
    assert target.read_text() == "done"
    assert os.listdir(tmp_path) == ["out.txt"]
    with pytest.raises(ValueError, match="does not exist"), io.atomic_output(tmp_path / "no/x"):
        pass


# ----------------------------------------------------------------------------- tables


def test_numeric_block_names_row_and_column():
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": ["1", "2", "oops"]})
    with pytest.raises(ValueError, match=r"data row 13 \(line 14 of the file\): column 'b'.*oops"):
        io.numeric_block(frame, ["a", "b"], first_row=10, source="f.csv")
    with pytest.raises(ValueError, match=r"f.parquet: row 3: column 'b'"):
        io.numeric_block(frame, ["a", "b"], source="f.parquet", fmt="parquet")
    values, keep = io.numeric_block(frame, ["a"])
    np.testing.assert_array_equal(values[:, 0], [1.0, 2.0, 3.0])
    assert keep.all()


def test_numeric_block_nan_policy():
    frame = pd.DataFrame({"a": [1.0, np.nan, 3.0, np.inf], "b": [1, 2, 3, 4]})
    with pytest.raises(ValueError, match=r"data row 2 .*column 'a' is missing.*--on-nan drop"):
        io.numeric_block(frame, ["a", "b"])
    values, keep = io.numeric_block(frame, ["a", "b"], on_nan="drop")
    assert keep.tolist() == [True, False, True, False]
    np.testing.assert_array_equal(values[keep], [[1.0, 1.0], [3.0, 3.0]])


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_iter_chunks_offsets_and_columns(tmp_path, rng, ext):
    frame = pd.DataFrame({"a": rng.normal(size=25), "b": np.arange(25), "c": ["t"] * 25})
    path = tmp_path / f"t.{ext}"
    frame.to_csv(path, index=False) if ext == "csv" else frame.to_parquet(path)
    chunks, total, unit = io.iter_chunks(path, ["a", "b"], chunksize=10)
    got = list(chunks)
    assert [first for _, first, _ in got] == [0, 10, 20]
    assert got[-1][2] == total and unit == ("bytes" if ext == "csv" else "rows")
    back = pd.concat([f for f, _, _ in got], ignore_index=True)
    assert list(back.columns) == ["a", "b"]
    np.testing.assert_array_equal(back["a"].to_numpy(), frame["a"].to_numpy())  # exact floats
    assert io.read_columns(path) == ["a", "b", "c"]


def test_table_writer_appends_chunks(tmp_path):
    for ext in ("csv", "parquet"):
        path = tmp_path / f"o.{ext}"
        with io.TableWriter(path, ext) as w:
            w.write(pd.DataFrame({"id": [1, 2], "p": [0.1, 1 / 3]}))
            w.write(pd.DataFrame({"id": [3], "p": [2.0]}))
        back = pd.read_csv(path) if ext == "csv" else pd.read_parquet(path)
        assert back["id"].tolist() == [1, 2, 3]
        assert back["p"].tolist() == [0.1, 1 / 3, 2.0]


def test_output_format():
    assert io.output_format("a/b.CSV") == "csv"
    assert io.output_format("b.parquet") == io.output_format("b.pq") == "parquet"
    with pytest.raises(ValueError, match=r"\.csv, \.parquet"):
        io.output_format("b.xlsx")


# ----------------------------------------------------------------------------- progress


class _Terminal(pyio.StringIO):
    def isatty(self):
        return True


def test_progress_draws_only_on_a_terminal():
    stream = pyio.StringIO()  # not a TTY
    with Progress(100, "work", unit="rows", stream=stream) as bar:
        bar.update(50)
    assert stream.getvalue() == ""
    stream = _Terminal()
    with Progress(200, "work", unit="rows", stream=stream) as bar:
        bar.update(50)
        bar.update(position=200)
    out = stream.getvalue()
    assert out.endswith("\n") and "work: 100%" in out and "200/200" in out and "rows" in out
    stream = _Terminal()
    with Progress(10, "work", stream=stream, quiet=True) as bar:
        bar.update(5)
        bar.update(position=8)
        assert bar.n == 8  # a quiet bar still counts
    assert stream.getvalue() == ""


def test_a_quiet_progress_never_imports_tqdm():
    code = (
        "import sys\n"
        "from nbattn._core.progress import Progress, running\n"
        "with Progress(10, 'work', quiet=True) as bar:\n"
        "    bar.update(3)\n"
        "with running('fit', quiet=True):\n"
        "    pass\n"
        "print('tqdm' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr


def test_progress_in_bytes_and_without_a_total():
    stream = pyio.StringIO()
    with Progress(3 * 2**20, "read", unit="bytes", stream=stream, force=True) as bar:
        bar.update(position=3 * 2**20)
    assert "3.00M/3.00M" in stream.getvalue() and "B/s" in stream.getvalue()
    stream = pyio.StringIO()
    with Progress(None, "fit", unit="rows", stream=stream, force=True) as bar:
        bar.update(3)
    assert stream.getvalue().endswith("\rfit: 3 rows [00:00]\n")


def test_running_ticker():
    stream = pyio.StringIO()
    with running("fit", stream=stream, force=True):
        pass
    assert stream.getvalue().startswith("\rfit: [00:00]")
    with pytest.raises(KeyError), running("fit", stream=pyio.StringIO(), force=True):
        raise KeyError("x")
    stream = pyio.StringIO()
    with running("fit", stream=stream, quiet=True, force=True):
        pass
    assert stream.getvalue() == ""


# ----------------------------------------------------------------------------- properties


@settings(max_examples=20)
@given(
    n=st.integers(2, 30),
    d=st.integers(1, 4),
    outputs=st.sampled_from([0, 1, 3]),
    bandwidth=st.sampled_from(["scott", "silverman", 0.3, "per-feature"]),
    names=st.booleans(),
    seed=seeds,
)
def test_round_trip_property(n, d, outputs, bandwidth, names, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, d)
    y = rng.normal(size=n) if outputs == 0 else rng.normal(size=(n, outputs))
    if bandwidth == "per-feature":
        bandwidth = list(rng.uniform(0.1, 3, d))
    if names:
        X = pd.DataFrame(X, columns=[f"c{j}" for j in range(d)])
    model = nbattn.NadarayaWatsonRegressor(bandwidth=bandwidth).fit(X, y)
    with tempfile.TemporaryDirectory() as folder:
        loaded = nbattn.load(nbattn.save(model, os.path.join(folder, "m.npz")))
    Xq = X.iloc[: max(1, n // 2)] if names else X[: max(1, n // 2)]
    np.testing.assert_array_equal(loaded.predict(Xq), model.predict(Xq))
    state = {k: v for k, v in vars(model).items() if k.endswith("_") or k.startswith("_")}
    for key, value in state.items():
        np.testing.assert_array_equal(getattr(loaded, key), value)


@settings(max_examples=25)
@given(
    n=st.integers(1, 60),
    chunksize=st.integers(1, 25),
    bad_row=st.integers(0, 59),
    column=st.sampled_from(["a", "b"]),
)
def test_text_cell_is_reported_at_its_row_whatever_the_chunks(n, chunksize, bad_row, column):
    bad_row %= n
    frame = pd.DataFrame({"a": np.arange(n) * 0.5, "b": np.arange(n) + 1.0}).astype(object)
    frame.loc[bad_row, column] = "word"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "t.csv")
        frame.to_csv(path, index=False)
        chunks, _, _ = io.iter_chunks(path, chunksize=chunksize)
        with pytest.raises(ValueError) as info:
            for chunk, first, _ in chunks:
                io.numeric_block(chunk, ["a", "b"], first_row=first, source="t.csv")
    expected = f"data row {bad_row + 1} (line {bad_row + 2} of the file): column '{column}'"
    assert expected in str(info.value)


# ----------------------------------------------------------------------------- hostile model files


def _npy(arr) -> bytes:
    buf = pyio.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
    return buf.getvalue()


def _npy_header(shape, dtype) -> bytes:
    buf = pyio.BytesIO()
    d = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, d)
    return buf.getvalue()


def _zip(path, members, deflate=()):
    """Write ``members`` (name -> bytes, in order; a list of pairs may repeat a name),
    stored, or deflated for the names in ``deflate``."""
    items = members.items() if isinstance(members, dict) else members
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in items:
            how = zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED
            zf.writestr(name, data, compress_type=how)


def _raw_members(path):
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _with_meta(raw, meta):
    return {**raw, "__nbattn__.npy": _npy(np.array(json.dumps(meta)))}


def test_deflated_member_is_refused_before_it_is_inflated(saved):
    import tracemalloc

    raw = _raw_members(saved)
    zeros = np.zeros(2**25)  # 256 MiB of float64, a few hundred kB deflated
    meta, _ = _split(saved)
    meta["attributes"]["X_fit_"]["shape"] = list(zeros.shape)
    raw["attr__X_fit_.npy"] = _npy(zeros)
    del zeros
    _zip(saved, _with_meta(raw, meta), deflate={"attr__X_fit_.npy"})
    assert saved.stat().st_size < 2**21
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="'attr__X_fit_.npy' is compressed"):
            nbattn.load(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**23  # nothing near the member's 256 MiB was allocated


def test_header_declaring_a_huge_array_is_refused_without_allocating(saved):
    raw = _raw_members(saved)
    meta, _ = _split(saved)
    meta["attributes"]["y_fit_"]["shape"] = [10**12]
    raw["attr__y_fit_.npy"] = _npy_header((10**12,), "<f8") + bytes(80)
    _zip(saved, _with_meta(raw, meta))
    with pytest.raises(ValueError, match="'attr__y_fit_.npy' holds .* bytes, not its shape's"):
        nbattn.load(saved)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"shape": [3]}, "has shape .* the metadata says \\(3,\\)"),
        ({"dtype": "<i8"}, "has dtype float64, the metadata says int64"),
        ({"dtype": "|O"}, "dtype object .* not allowed"),
        ({"dtype": "<M8[s]"}, "not allowed"),
        ({"shape": [-1]}, "not allowed"),
        ({"shape": "12"}, "no valid dtype and shape"),
        ({"shape": [40, True]}, "no valid dtype and shape"),
        ({"dtype": None}, "no valid dtype and shape"),
    ],
)
def test_declared_dtype_and_shape_must_match_the_archive(saved, edit, message):
    meta, arrays = _split(saved)
    meta["attributes"]["y_fit_"].update(edit)
    _rewrite(saved, meta, arrays)
    with pytest.raises(ValueError, match=message):
        nbattn.load(saved)


def test_members_not_described_by_the_metadata_are_refused(saved):
    raw = _raw_members(saved)
    _zip(saved, {**raw, "attr__extra_.npy": _npy(np.arange(3))})
    with pytest.raises(ValueError, match="'attr__extra_.npy' is not described by the metadata"):
        nbattn.load(saved)
    with pytest.warns(UserWarning, match="Duplicate name"):  # zipfile warns, and writes it
        _zip(saved, [*raw.items(), ("attr__y_fit_.npy", raw["attr__y_fit_.npy"])])
    with pytest.raises(ValueError, match="appears twice"):
        nbattn.load(saved)
    _zip(saved, {**raw, "notes.txt": b"hello"})
    with pytest.raises(ValueError, match="'notes.txt' is not an array of a model file"):
        nbattn.load(saved)
    missing = {k: v for k, v in raw.items() if k != "attr__y_fit_.npy"}
    _zip(saved, missing)
    with pytest.raises(ValueError, match="'attr__y_fit_' is missing"):
        nbattn.load(saved)


def test_oversized_metadata_is_refused_before_it_is_read(saved, monkeypatch):
    monkeypatch.setattr(modelfile, "MAX_METADATA_BYTES", 1000)
    with pytest.raises(ValueError, match=r"metadata of \d+ bytes \(at most 1000\)"):
        nbattn.load(saved)


def test_edited_parameters_are_refused_even_with_a_recomputed_checksum(saved):
    # needs nbattn.estimators.check_fitted_state (the estimator's own constraints)
    meta, arrays = _split(saved)
    meta["params"]["kernel"] = "evil"
    _rewrite(saved, meta, arrays)  # the checksum is recomputed: anyone can
    with pytest.raises(ValueError, match="kernel"):
        nbattn.load(saved)


def test_edited_fitted_shapes_are_refused_even_with_a_recomputed_checksum(saved):
    # needs nbattn.estimators.check_fitted_state (fitted attributes' shapes agree)
    meta, arrays = _split(saved)
    arrays["attr__bandwidth_"] = np.ones(5)
    meta["attributes"]["bandwidth_"]["shape"] = [5]
    _rewrite(saved, meta, arrays)
    with pytest.raises(ValueError, match="bandwidth_"):
        nbattn.load(saved)


def test_stored_file_has_shapes_and_dtypes_in_its_metadata(saved):
    meta, arrays = _split(saved)
    for name, arr in arrays.items():
        described = meta["attributes"][name.removeprefix("attr__")]
        assert described["dtype"] == arr.dtype.str and described["shape"] == list(arr.shape)
    with zipfile.ZipFile(saved) as zf:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())


# ----------------------------------------------------------------------------- hostile tables


def test_duplicated_column_names_are_an_error(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,a\n1,2,3\n")
    with pytest.raises(ValueError, match="column name 'a' appears more than once"):
        io.read_columns(path)
    path.write_text("a,b,,\n1,2,3,4\n")  # unnamed columns are not duplicates of each other
    assert io.read_columns(path)[:2] == ["a", "b"]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table([[1], [2]], names=["x", "x"]), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="column name 'x' appears more than once"):
        io.read_columns(tmp_path / "d.parquet")


@settings(max_examples=25)
@given(n=st.integers(1, 40), chunksize=st.integers(1, 15), bad=st.integers(0, 39))
def test_row_with_more_fields_is_reported_at_its_line(n, chunksize, bad):
    bad %= n
    lines = ["a,b"] + [f"{i},{i * 0.5}" for i in range(n)]
    lines[bad + 1] += ",9"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "t.csv")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        for columns in (None, ["a"]):  # also when only some columns are wanted
            chunks, _, _ = io.iter_chunks(path, columns, chunksize=chunksize)
            with pytest.raises(ValueError) as info:
                list(chunks)
            line = bad + 2
            assert f"line {line} has 3 fields; the header has 2" in str(
                info.value
            ) or f"line {line} has more fields than the header" in str(info.value)


def test_text_columns_keep_their_type_across_chunks(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("x,label\n" + "".join(f"{i},{i % 2}\n" for i in range(6)) + "6,a\n")
    chunks, _, _ = io.iter_chunks(path, chunksize=3, text_columns=["label"])
    labels = [v for frame, _, _ in chunks for v in frame["label"]]
    assert labels == ["0", "1", "0", "1", "0", "1", "a"]


def test_labels_from_text():
    text = np.array(["2", "10", "-1"], dtype=object)
    assert io.labels_from_text(text).tolist() == [2, 10, -1]
    mixed = np.array(["2", "x"], dtype=object)
    assert io.labels_from_text(mixed).tolist() == ["2", "x"]
    # numbers that are not all integers are floats (a continuous target stays continuous)
    floats = io.labels_from_text(np.array(["0.25", "2", "-1e3"], dtype=object))
    assert floats.dtype == np.float64 and floats.tolist() == [0.25, 2.0, -1000.0]
    # typed by the model's classes, not by what one chunk holds
    assert io.labels_from_text(text, classes=np.array(["10", "2", "x"])).tolist() == text.tolist()
    assert io.labels_from_text(mixed, classes=np.array([1, 2])).tolist() == [2, "x"]
    assert io.labels_from_text(np.array(["1.5"], object), np.array([0.5, 1.5])).tolist() == [1.5]
    parquet = np.array([1, 2])
    assert io.labels_from_text(parquet) is not None and io.labels_from_text(parquet).tolist() == [
        1,
        2,
    ]


def test_shortened_values():
    assert io.shorten("abc") == "'abc'"
    long = io.shorten("x" * 10_000)
    assert len(long) < 80 and long.endswith("(10002 characters)")


# ----------------------------------------------------------------------------- output files


def test_atomic_output_keeps_the_mode_and_writes_through_symlinks(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o604)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with io.atomic_output(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and target.read_text() == "new"
    assert os.stat(target).st_mode & 0o777 == 0o604
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "out.txt"]


def test_atomic_output_cleans_up_on_interruption(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt), io.atomic_output(target) as tmp:
        tmp.write_text("partial")
        raise KeyboardInterrupt
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_atomic_output_cleans_up_an_interruption_just_after_the_open(tmp_path, monkeypatch):
    # a signal handled just after the temporary file appears, before the name is
    # handed back (a process descheduled after the open, as on a loaded machine)
    real_open = os.open

    def open_then_interrupt(name, *args, **kwargs):
        fd = real_open(name, *args, **kwargs)
        if str(name).endswith(".part"):
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    target = tmp_path / "out.txt"
    target.write_text("old")
    monkeypatch.setattr(os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt), io.atomic_output(target):
        pass
    monkeypatch.undo()
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("module", [io, modelfile])
def test_io_imports_no_package_level_names(module):
    import ast
    from pathlib import Path

    package = Path(module.__file__).parent
    tree = ast.parse(Path(module.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert all(not a.name.startswith("nbattn") for a in node.names)
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            # "from . import x" only for submodules, never for names of nbattn/__init__
            names = [node.module] if node.module else [a.name for a in node.names]
            for name in names:
                path = package / name.split(".")[0]
                assert path.with_suffix(".py").exists() or path.is_dir(), name


def test_wide_csv_chunks_stay_within_the_cell_budget(tmp_path, rng, monkeypatch):
    frame = pd.DataFrame(rng.normal(size=(95, 6)), columns=list("abcdef"))
    path = tmp_path / "w.csv"
    frame.to_csv(path, index=False)
    monkeypatch.setattr(io, "CSV_CHUNK_CELLS", 60)  # 10 rows of 6 columns
    chunks, _, _ = io.iter_chunks(path, ["b"], chunksize=1000)
    got = list(chunks)
    assert [len(f) for f, _, _ in got] == [10] * 9 + [5]
    assert [first for _, first, _ in got] == list(range(0, 95, 10))
    back = pd.concat([f for f, _, _ in got], ignore_index=True)
    np.testing.assert_array_equal(back["b"].to_numpy(), frame["b"].to_numpy())


def test_model_files_save_the_parameters_the_spec_says(monkeypatch):
    import dataclasses

    from nbattn.estimators.spec import SPECS

    model = nbattn.NadarayaWatsonRegressor(verbose=1)
    assert modelfile._saved_params(model) == (model.get_params(), {})
    spec = SPECS["NadarayaWatsonRegressor"]
    unsaved = tuple(dataclasses.replace(p, saved=p.name != "verbose") for p in spec.params)
    monkeypatch.setattr(type(model), "_spec", dataclasses.replace(spec, params=unsaved))
    params, _ = modelfile._saved_params(model)
    assert "verbose" not in params and set(params) == set(model.get_params()) - {"verbose"}
