"""What the app's tests share: the command run in this process, its fit on a CSV, and a
Dask cluster of two worker processes."""

import pytest

from nbattn.app import cli


@pytest.fixture
def nbattn_cli(capsys):
    """``nbattn ARGS`` in this process: a function of the arguments that returns
    (exit code, stdout, stderr)."""

    def call(*args):
        code = cli.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture
def fit_csv(nbattn_cli):
    """``nbattn fit DATA --target TARGET -q OPTIONS``: a function of (data, *options,
    target="y") that returns (exit code, stdout, stderr)."""

    def fit(data, *options, target="y"):
        return nbattn_cli("fit", data, "--target", target, "-q", *options)

    return fit


@pytest.fixture(scope="module")
def client():
    """A ``distributed`` client of a LocalCluster with two single-threaded worker
    processes, one per test module that asks for it (a module may define its own)."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()
