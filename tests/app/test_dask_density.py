"""nbattn.dask.predict with the density estimators on a real LocalCluster with two
workers: a quantile regressor's predict, the conditional quantiles at given levels and
a density's log density, each equal to the in-memory result."""

import numpy as np
import pandas as pd
import pytest

import nbattn

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
nbdask = pytest.importorskip("nbattn.dask")

#: the array inputs are read by position, as the models fitted on a table allow
pytestmark = pytest.mark.filterwarnings("ignore:X does not have valid feature names")


@pytest.fixture(scope="module")
def client():
    # workers as threads of this process: a real scheduler and two workers, without the
    # start-up of two Python processes that import nbattn and load its kernels again
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = pd.DataFrame({"a": rng.uniform(0, 4, 150), "b": rng.normal(size=150)})
    y = np.sin(X["a"].to_numpy()) + 0.3 * X["b"].to_numpy() + rng.normal(0, 0.2, 150)
    queries = pd.DataFrame(
        {"a": rng.uniform(0, 4, 90), "b": rng.normal(size=90)}, index=np.arange(90) * 2 + 5
    )
    return X, y, queries


@pytest.fixture(scope="module")
def models(data):
    X, y, _ = data
    quantile = nbattn.KernelQuantileRegressor(quantile=0.7, bandwidth="normal_reference")
    return {
        "quantile": quantile.fit(X, y),
        "cdens": nbattn.ConditionalKernelDensity().fit(X, y),
        "kde": nbattn.KernelDensity().fit(X),
    }


def test_quantile_predict_on_the_cluster_equals_in_memory(client, data, models):
    _, _, queries = data
    model = models["quantile"]
    got = nbdask.predict(model, dd.from_pandas(queries, npartitions=3)).compute()
    pd.testing.assert_index_equal(got.index, queries.index)
    assert got.name == "prediction"
    np.testing.assert_array_equal(got.to_numpy(), model.predict(queries))
    array = da.from_array(queries.to_numpy(), chunks=(25, 1))
    got = nbdask.predict(model, array).compute()
    np.testing.assert_array_equal(got, model.predict(queries.to_numpy()))


@pytest.mark.parametrize("name", ["quantile", "cdens"])
def test_quantiles_at_levels_on_the_cluster_equal_in_memory(client, data, models, name):
    _, _, queries = data
    model = models[name]
    levels = [0.1, 0.5, 0.9]
    got = nbdask.predict(
        model, dd.from_pandas(queries, npartitions=4), method="predict_quantile", quantiles=levels
    ).compute()
    assert list(got.columns) == ["q0.1", "q0.5", "q0.9"]
    pd.testing.assert_index_equal(got.index, queries.index)
    np.testing.assert_array_equal(got.to_numpy(), model.predict_quantile(queries, levels))
    array = da.from_array(queries.to_numpy(), chunks=(40, 2))
    got = nbdask.predict(model, array, method="predict_quantile", quantiles=levels, progress=2)
    np.testing.assert_array_equal(got, model.predict_quantile(queries.to_numpy(), levels))


def test_log_density_on_the_cluster_equals_in_memory(client, data, models):
    _, _, queries = data
    model = models["kde"]
    got = nbdask.predict(model, dd.from_pandas(queries, npartitions=3), method="score_samples")
    got = got.compute()
    assert got.name == "log_density"
    np.testing.assert_array_equal(got.to_numpy(), model.score_samples(queries))
    array = da.from_array(queries.to_numpy(), chunks=(30, 2))
    got = nbdask.predict(model, array, method="score_samples").compute()
    np.testing.assert_array_equal(got, model.score_samples(queries.to_numpy()))


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("kde", {"method": "predict_quantile", "quantiles": [0.5]}, "no predict_quantile"),
        ("cdens", {"method": "score_samples"}, "needs y"),
        ("quantile", {"method": "predict_quantile", "quantiles": [1.5]}, "quantiles must be"),
        ("quantile", {"quantiles": [0.5]}, "levels of method='predict_quantile'"),
        ("quantile", {"method": "pdf"}, "method must be"),
        ("cdens", {"method": "predict_quantile", "quantiles": [0.5, 0.5]}, "given twice"),
    ],
)
def test_methods_that_do_not_apply_are_refused(data, models, name, options, message):
    _, _, queries = data
    with pytest.raises(ValueError, match=message):
        nbdask.predict(models[name], dd.from_pandas(queries, npartitions=2), **options)


@pytest.mark.parametrize(
    "name, options",
    [
        ("quantile", {}),
        ("cdens", {"method": "predict_quantile", "quantiles": [0.2, 0.8]}),
        ("kde", {"method": "score_samples"}),
    ],
)
def test_empty_partitions_give_empty_output(client, data, models, name, options):
    """A filter that empties some partitions: their rows are none, the others' as in memory."""
    _, _, queries = data
    frame = dd.from_pandas(queries, npartitions=4)
    # a filter inside each partition: the later partitions keep no row (as a value filter
    # on a sorted column leaves them), their count unchanged
    kept = frame.map_partitions(lambda part: part[part.index < 60])
    assert kept.map_partitions(len).compute().tolist()[-1] == 0
    got = nbdask.predict(models[name], kept, **options).compute()
    subset = queries[queries.index < 60]
    method = options.get("method", "predict")
    if method == "predict_quantile":
        want = models[name].predict_quantile(subset, options["quantiles"])
    else:
        want = getattr(models[name], method)(subset)
    np.testing.assert_array_equal(np.asarray(got), want)
    pd.testing.assert_index_equal(got.index, subset.index)


def test_cli_predict_of_a_conditional_density_on_the_cluster_equals_local_run(
    client, tmp_path, data
):
    from nbattn.app.cli import main

    X, y, queries = data
    X.assign(y=y).to_csv(tmp_path / "train.csv", index=False)
    rng = np.random.default_rng(4)
    queries.assign(y=rng.normal(size=len(queries))).to_csv(tmp_path / "q.csv", index=False)
    model = str(tmp_path / "m.npz")
    fit = ["fit", str(tmp_path / "train.csv"), "--model", "cdens", "--target", "y", "-q"]
    assert main([*fit, "-o", model]) == 0
    common = [model, str(tmp_path / "q.csv"), "--chunksize", "20", "--quantiles", "0.2,0.8", "-q"]
    assert main(["predict", *common, "-o", str(tmp_path / "local.csv")]) == 0
    address = client.scheduler.address
    assert main(["predict", *common, "--scheduler", address, "-o", str(tmp_path / "d.csv")]) == 0
    local, remote = pd.read_csv(tmp_path / "local.csv"), pd.read_csv(tmp_path / "d.csv")
    assert list(remote.columns) == ["q0.2", "q0.8", "log_density"]
    pd.testing.assert_frame_equal(local, remote)
