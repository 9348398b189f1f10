"""Model files (nbattn.save / nbattn.load), atomic output, chunked tables, progress."""

import io as pyio
import json
import os
import tempfile
import zipfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError

import nbattn
from nbattn import io
from nbattn.progress import Progress, running


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
        meta["sha256"] = io._digest(meta, arrays)
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


def test_round_trip_arrays_multioutput_and_extra_state(tmp_path, rng):
    X = rng.normal(size=(30, 3))
    Y = rng.normal(size=(30, 2))
    model = nbattn.NadarayaWatsonRegressor(bandwidth="silverman").fit(X, Y)
    model.extra_ = np.arange(4, dtype=np.int32)  # an attribute a future estimator might have
    model.curve_ = [1.0, 0.5, 0.25]
    model.scalar_ = np.float64(2.5)
    model._private_count = 7
    loaded = nbattn.load(nbattn.save(model, tmp_path / "m.npz"))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.predict(X).shape == (30, 2)
    assert loaded.extra_.dtype == np.int32 and list(loaded.extra_) == [0, 1, 2, 3]
    assert loaded.curve_ == [1.0, 0.5, 0.25]
    assert isinstance(loaded.scalar_, np.float64) and loaded.scalar_ == 2.5
    assert loaded._private_count == 7
    assert not hasattr(loaded, "feature_names_in_")


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
    for name in ("X_fit_", "y_fit_", "bandwidth_", "n_features_in_", "_y_ndim"):
        assert name in meta["attributes"]
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
    cls = getattr(nbattn, name, None)
    if cls is None:
        pytest.skip(f"nbattn.{name} is not in this branch yet")
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


def test_other_format_version_is_refused(saved):
    meta, arrays = _split(saved)
    meta["format_version"] = 2
    _rewrite(saved, meta, arrays)
    with pytest.raises(ValueError, match="format version 2.*reads version 1"):
        nbattn.load(saved)


def test_truncated_file_is_refused(saved):
    data = saved.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 100):
        saved.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated|corrupt"):
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


def test_progress_draws_only_on_a_terminal():
    stream = pyio.StringIO()  # not a TTY
    with Progress(100, "work", unit="rows", stream=stream) as bar:
        bar.update(50)
    assert stream.getvalue() == ""
    stream = pyio.StringIO()
    with Progress(200, "work", unit="rows", stream=stream, force=True) as bar:
        bar.update(50)
        assert bar.message().startswith("work:  25% |######")
        bar.update(position=200)
    out = stream.getvalue()
    assert out.endswith("\n") and "100%" in out and "200/200 rows" in out
    stream = pyio.StringIO()
    with Progress(10, "work", stream=stream, force=True, quiet=True) as bar:
        bar.update(5)
    assert stream.getvalue() == ""


def test_running_ticker():
    stream = pyio.StringIO()
    with running("fit", stream=stream, force=True):
        pass
    assert stream.getvalue().startswith("\rfit: [00:00]")
    with pytest.raises(KeyError), running("fit", stream=pyio.StringIO(), force=True):
        raise KeyError("x")


# ----------------------------------------------------------------------------- properties


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 30),
    d=st.integers(1, 4),
    outputs=st.sampled_from([0, 1, 3]),
    bandwidth=st.sampled_from(["scott", "silverman", 0.3, "per-feature"]),
    names=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
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


@settings(max_examples=25, deadline=None)
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
