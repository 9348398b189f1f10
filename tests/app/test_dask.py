"""nbattn.dask on a real LocalCluster with two worker processes."""

import os
import signal
import time

import numpy as np
import pandas as pd
import pytest

import nbattn

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
nbdask = pytest.importorskip("nbattn.dask")


# First, before the module's cluster exists: no distributed client at all.
def test_fit_and_predict_without_a_client_use_the_local_scheduler():
    assert nbdask._current_client() is None
    rng = np.random.default_rng(11)
    frame = pd.DataFrame(rng.uniform(0, 5, size=(200, 2)), columns=["a", "b"])
    target = pd.Series(np.sin(frame["a"]) + rng.normal(0, 0.1, 200), name="y")
    make = lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo")  # noqa: E731
    model = nbdask.fit(
        make(), dd.from_pandas(frame, npartitions=3), dd.from_pandas(target, npartitions=3)
    )
    local = make().fit(frame, target)
    np.testing.assert_array_equal(model.bandwidth_, local.bandwidth_)
    got = nbdask.predict(model, dd.from_pandas(frame, npartitions=3)).compute()
    np.testing.assert_array_equal(got.to_numpy(), local.predict(frame))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    keys = rng.uniform(0, 6, size=(3000, 2))
    values = np.sin(keys[:, 0]) + 0.1 * keys[:, 1] + rng.normal(0, 0.2, 3000)
    queries = rng.uniform(0, 6, size=(2000, 2))
    return queries, keys, values


def test_predict_dataframe_equals_in_memory_and_keeps_index(client, data):
    queries, keys, values = data
    cols = ["a", "b"]
    model = nbattn.NadarayaWatsonRegressor().fit(pd.DataFrame(keys, columns=cols), values)
    frame = pd.DataFrame(queries, columns=cols, index=np.arange(len(queries)) * 3 + 11)
    ddf = dd.from_pandas(frame, npartitions=4)
    got = nbdask.predict(model, ddf).compute()
    expected = model.predict(frame)
    pd.testing.assert_index_equal(got.index, frame.index)
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12, atol=0)


def test_predict_multi_output_array(client, data):
    queries, keys, values = data
    model = nbattn.NadarayaWatsonRegressor().fit(keys, np.column_stack([values, -values]))
    got = nbdask.predict(model, da.from_array(queries, chunks=(300, 2))).compute()
    np.testing.assert_allclose(got, model.predict(queries), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "labels",
    [
        np.array(["setosa", "virginica", "versicolor"]),
        np.array([3, 7, 11]),
        np.array([1.0, 2.0, 5.0]),
    ],
)
def test_predict_of_a_classifier_declares_the_labels_dtype(client, data, labels):
    queries, keys, values = data
    y = labels[np.digitize(values, [-0.5, 0.5])]
    model = nbattn.NadarayaWatsonClassifier().fit(keys, y)
    expected = model.predict(queries)
    frame = pd.DataFrame(queries, columns=["a", "b"])
    lazy = nbdask.predict(model, dd.from_pandas(frame, npartitions=3))
    got = lazy.compute()
    assert lazy.dtype == got.dtype == pd.Series(expected).dtype
    np.testing.assert_array_equal(got.to_numpy(), expected)
    lazy = nbdask.predict(model, da.from_array(queries, chunks=(700, 2)))
    got = lazy.compute()
    assert lazy.dtype == got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("key_chunk", [3000, 1000, 333])
def test_sharded_keys_merge_is_exact(client, data, key_chunk):
    queries, keys, values = data
    got = nbdask.nadaraya_watson_sharded(
        da.from_array(queries, chunks=(500, 2)),
        da.from_array(keys, chunks=(key_chunk, 2)),
        da.from_array(values, chunks=key_chunk),
        bandwidth="scott",
    ).compute()
    expected = nbattn.nadaraya_watson(queries, keys, values, "scott")
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def _clustered(seed, n_keys=12000, n_queries=1500):
    """Keys in 12 tight clusters far apart (a tenth of them duplicated), two outputs;
    queries near the clusters, ten of them far from every key."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-60, 60, size=(12, 2))
    keys = centres[rng.integers(0, 12, n_keys)] + rng.normal(0, 0.6, (n_keys, 2))
    tenth = n_keys // 10
    keys[:tenth] = keys[tenth : 2 * tenth]
    values = np.column_stack([np.sin(keys[:, 0]), keys[:, 1] * 1e3]) + rng.normal(
        0, 0.1, (n_keys, 2)
    )
    queries = centres[rng.integers(0, 12, n_queries)] + rng.normal(0, 1.0, (n_queries, 2))
    queries[:10] += 1e3
    return queries, keys, values


@pytest.mark.parametrize("rtol", [1e-6, 1e-3, 0.1])
def test_sharded_keys_within_rtol_obey_the_single_machine_bound(client, rtol):
    """Each shard prunes its own tree within rtol of its own sums; the merged prediction
    obeys nadaraya_watson's bound rtol / (1 - rtol) max_j |v_j - f_i| against the exact
    one, on shards of unequal sizes, and two computations give the same bits."""
    h = np.array([0.7, 0.7])
    pruned = 0
    for seed in range(3):
        queries, keys, values = _clustered(seed)
        lazy = nbdask.nadaraya_watson_sharded(
            da.from_array(queries, chunks=(600, 2)),
            da.from_array(keys, chunks=((5000, 4000, 3000), 2)),
            da.from_array(values, chunks=((5000, 4000, 3000), 2)),
            bandwidth=h,
            rtol=rtol,
        )
        got = lazy.compute()
        np.testing.assert_array_equal(got, lazy.compute())
        exact = nbattn.nadaraya_watson(queries, keys, values, h)
        spread = np.abs(values[None, :, :] - exact[:, None, :]).max(axis=1)
        bound = rtol / (1.0 - rtol) * spread + 1e-12 * np.abs(values).max(axis=0)
        assert (np.abs(got - exact) <= bound).all(), np.abs(got - exact).max()
        pruned += int((got != exact).any())
    if rtol >= 1e-3:  # the trees did prune (else the bound was never exercised)
        assert pruned == 3


def test_sharded_keys_refuse_an_rtol_outside_0_1():
    keys = da.from_array(np.zeros((4, 1)), chunks=(2, 1))
    for bad in (1.0, -0.1, float("nan"), True, "1e-3"):
        with pytest.raises(ValueError, match="rtol"):
            nbdask.nadaraya_watson_sharded(np.zeros((2, 1)), keys, keys[:, 0], 1.0, rtol=bad)


def test_merge_of_empty_shard_is_identity():
    out = np.array([[1.0], [2.0]])
    lse = np.array([0.5, -np.inf])
    empty = (np.zeros((2, 1)), np.array([-np.inf, -np.inf]))
    merged_out, merged_lse = nbdask.merge_partial((out, lse), empty)
    np.testing.assert_array_equal(merged_out, [[1.0], [0.0]])
    np.testing.assert_array_equal(merged_lse, lse)


def test_workers_load_kernels_from_cache(client, data):
    queries, keys, values = data
    model = nbattn.NadarayaWatsonRegressor().fit(keys, values)
    model.predict(queries[:5])  # this process has compiled (and cached) the kernel

    def predict_then_cache_stats():
        from nbattn.kernels import pooling

        model.predict(queries[:5])
        stats = pooling._pool_items.stats  # gaussian_pool's kernel
        return sum(stats.cache_misses.values()), sum(stats.cache_hits.values())

    for misses, hits in client.run(predict_then_cache_stats).values():
        assert misses == 0 and hits >= 1


def test_predict_rejects_in_memory_data(data):
    queries, keys, values = data
    model = nbattn.NadarayaWatsonRegressor().fit(keys, values)
    with pytest.raises(ValueError, match="dask DataFrame or dask Array"):
        nbdask.predict(model, queries)


def test_cli_predict_on_the_cluster_equals_local_run(client, tmp_path, data):
    from nbattn.app.cli import main

    queries, keys, values = data
    train = pd.DataFrame({"a": keys[:, 0], "b": keys[:, 1], "y": values})
    test = pd.DataFrame({"id": np.arange(len(queries)), "a": queries[:, 0], "b": queries[:, 1]})
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    model = str(tmp_path / "model.npz")
    assert main(["fit", str(tmp_path / "train.csv"), "--target", "y", "-o", model, "-q"]) == 0
    common = [model, str(tmp_path / "test.csv"), "--chunksize", "300", "--id-column", "id", "-q"]
    assert main(["predict", *common, "-o", str(tmp_path / "local.csv")]) == 0
    address = client.scheduler.address
    assert main(["predict", *common, "--scheduler", address, "-o", str(tmp_path / "dask.csv")]) == 0
    local = pd.read_csv(tmp_path / "local.csv")
    remote = pd.read_csv(tmp_path / "dask.csv")
    pd.testing.assert_frame_equal(local, remote)
    assert len(remote) == len(queries)


def test_cli_unreachable_scheduler_fails_cleanly(tmp_path, data, capsys, monkeypatch):
    from nbattn import config
    from nbattn.app.cli import main

    monkeypatch.setattr(config, "DASK_CONNECT_TIMEOUT", 2)

    queries, keys, values = data
    pd.DataFrame({"a": keys[:50, 0], "y": values[:50]}).to_csv(tmp_path / "t.csv", index=False)
    model = str(tmp_path / "m.npz")
    assert main(["fit", str(tmp_path / "t.csv"), "--target", "y", "-o", model, "-q"]) == 0
    out = tmp_path / "p.csv"
    args = ["predict", model, str(tmp_path / "t.csv"), "-o", str(out), "-q"]
    assert main([*args, "--scheduler", "tcp://127.0.0.1:9"]) == 1
    assert "dask scheduler" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("how", ["diagonal", "full", "scalar-1d", "diagonal-rtol"])
def test_sharded_loo_sums_equal_in_memory(client, how):
    """Each evaluation's row ranges as tasks on the cluster: the same sums. With rtol the
    keys are pruned here, before the tasks (forced at this size: leaves of 4 keys), and
    the workers walk the leaves they are sent."""
    from nbattn.smoothing import loo

    from .._config import config_values

    rng = np.random.default_rng(3)
    X = rng.uniform(0, 5, size=(300, 3))
    y = np.column_stack([np.sin(X[:, 0]), X[:, 1]]) + rng.normal(0, 0.1, size=(300, 2))
    if how == "diagonal-rtol":
        pruned = {"LOO_PRUNE_MIN_ROWS": 2, "LOO_TILE_LEAF_KEYS": 4, "LOO_BOXED_MAX_SHARE": 1.0}

        def run():
            with config_values(**pruned):
                return loo.loo_loss_and_grad(X, y, [0.3, 0.3, 0.3], rtol=1e-3)

        exact = loo.loo_loss_and_grad(X, y, [0.3, 0.3, 0.3])
        assert run()[0] != exact[0]  # the tolerance pruned something
    elif how == "diagonal":
        run = lambda: loo.loo_loss_and_grad(X, y, [0.5, 1.0, 2.0])  # noqa: E731
    elif how == "full":
        L = rng.normal(size=(2, 3))
        run = lambda: loo.loo_loss_and_grad(X, y, components=L)  # noqa: E731
    else:
        run = lambda: (loo.loo_loss(X[:, :1], y, 0.3), np.zeros(1))  # noqa: E731
    expected = run()
    with distributed.get_task_stream(client) as stream, nbdask.sharded_training(client, 3):
        got = run()
        again = run()
    assert len(stream.data) >= 3  # the row ranges ran as tasks on the cluster
    if how == "diagonal-rtol":
        # a tile keeps the leaves its own rows reach: other row ranges, other tiles, so the
        # sharded sums agree with the in-memory ones within the bound (each fit within
        # rtol / (1 - rtol) of the range of y, so the loss within 4 rtol / (1 - rtol)
        # range^2), and with themselves to the bit
        assert again[0] == got[0] and np.array_equal(again[1], got[1])
        allowed = 4.0 * 1e-3 / (1 - 1e-3) * float(np.mean(np.ptp(y, axis=0) ** 2))
        assert abs(got[0] - exact[0]) <= allowed and abs(expected[0] - exact[0]) <= allowed
        return
    assert got[0] == pytest.approx(expected[0], rel=1e-12)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(
    "make",
    [
        lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo"),
        lambda: nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=30),
    ],
)
def test_fit_on_dask_dataframe_equals_in_memory_fit(client, make):
    rng = np.random.default_rng(5)
    frame = pd.DataFrame(rng.uniform(0, 5, size=(400, 3)), columns=["a", "b", "c"])
    target = pd.Series(np.sin(frame["a"]) + rng.normal(0, 0.1, 400), name="y")
    model = nbdask.fit(
        make(), dd.from_pandas(frame, npartitions=4), dd.from_pandas(target, npartitions=4)
    )
    local = make().fit(frame, target)
    np.testing.assert_allclose(model.bandwidth_, local.bandwidth_, rtol=1e-8)
    np.testing.assert_allclose(model.predict(frame), local.predict(frame), rtol=1e-8)
    assert list(model.feature_names_in_) == ["a", "b", "c"]


def _mixed_table(n, seed):
    """(X, y): two continuous columns (no tied rows) and a categorical one."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.uniform(0, 5, size=(n, 2)), rng.integers(0, 3, n)])
    y = np.sin(X[:, 0]) + 0.3 * X[:, 2] + rng.normal(0, 0.1, n)
    return X, y


@pytest.mark.parametrize("rtol", [0.0, 1e-3])
def test_engine_loo_sums_on_the_cluster_equal_in_memory(client, rtol):
    """The local-polynomial engine's criterion and gradient as row-range tasks
    (nbattn.local.rows): ranges of the layout's chunks, each pruned (rtol > 0, forced
    at this size) against the whole tree as in memory, each returning its rows."""
    from nbattn.local.widths import local_loo_loss_and_grad, widths_to_theta

    from .._config import config_values

    X, y = _mixed_table(240, 9)
    theta = widths_to_theta(np.array([0.4, 0.5, 0.2]), "ccu", (0, 0, 3))
    forced = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}

    def run():
        with config_values(**forced):
            return local_loo_loss_and_grad(X, y, theta, 1, var_type="ccu", rtol=rtol)

    expected = run()
    with distributed.get_task_stream(client) as stream, nbdask.sharded_training(client, 3):
        got = run()
        again = run()
    names = [task["key"] for task in stream.data]
    assert sum("chunk_range" in str(name) for name in names) >= 6  # two evaluations, 3 ranges
    # the tasks return their rows, summed here in the in-memory order: the same bits
    assert got[0] == expected[0] and again[0] == got[0]
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(again[1], got[1])


def test_local_polynomial_fit_on_the_cluster_equals_in_memory(client):
    """LocalPolynomialRegressor's leave-one-out width search through nbattn.dask.fit: every
    evaluation on the cluster, the same widths as in memory."""
    X, y = _mixed_table(90, 4)
    X = X[:, [0, 2]]  # one continuous and one categorical column: a short search
    make = lambda: nbattn.LocalPolynomialRegressor(var_type="cu")  # noqa: E731
    with distributed.get_task_stream(client) as stream:
        model = nbdask.fit(make(), da.from_array(X, chunks=(30, 2)), da.from_array(y, chunks=30))
    assert sum("chunk_range" in str(task["key"]) for task in stream.data) >= 30
    local = make().fit(X, y)
    np.testing.assert_array_equal(model.bandwidth_, local.bandwidth_)
    np.testing.assert_array_equal(model.predict(X), local.predict(X))


# Last: it kills a worker of the shared cluster.
def test_worker_killed_mid_job_still_gives_identical_results(client, data):
    queries, keys, values = data
    big_queries = np.tile(queries, (10, 1))
    model = nbattn.NadarayaWatsonRegressor().fit(keys, values)
    expected = model.predict(big_queries)
    future = client.compute(nbdask.predict(model, da.from_array(big_queries, chunks=(500, 2))))
    pids = client.run(os.getpid)
    time.sleep(0.5)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    got = future.result(timeout=300)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    client.wait_for_workers(2, timeout=120)  # the nanny restarts the killed worker


def test_the_suites_workers_take_the_compile_lock():
    """tests/dask_worker_setup.py runs in every worker a cluster of the suite starts: a
    kernel that is not cached yet is compiled once across the workers and the test
    processes, not by each. (A cluster of its own: the module's shared one may have lost
    a worker to an earlier test.)"""
    distributed = pytest.importorskip("distributed")

    def locked():
        from numba.core import dispatcher

        return getattr(dispatcher.Dispatcher.compile, "_nbattn_locked", False)

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.wait_for_workers(2)
        assert list(c.run(locked).values()) == [True, True]
