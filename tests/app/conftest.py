"""What the command's tests share: the command run in this process, and its fit on a CSV."""

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
