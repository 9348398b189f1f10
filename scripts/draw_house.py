"""Draw nbattn's layers as a house: one floor per layer of the import-linter contract.

Reads the ``layers`` contract in pyproject.toml (the same one ``lint-imports`` checks) and
the package's import graph (grimp, which import-linter brings), and draws each floor with
its rooms (the modules, with their line counts) and, on the right, how many imports go
from each floor to each floor below it. Writes docs/house.png (or the path given).

Usage: python scripts/draw_house.py [OUT.png]
"""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import grimp
import matplotlib
import tomllib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def layers() -> list[list[str]]:
    """The floors, top first; each a list of the packages or modules on it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [
        [part.strip() for part in line.replace(":", "|").split("|")] for line in contract["layers"]
    ]


def names_of(floor: list[str]) -> str:
    return " | ".join(name.removeprefix("nbattn.") for name in floor)


def lines_of(module: str) -> int:
    path = ROOT.joinpath(*module.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return len(file.read_text().splitlines())


def main(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("nbattn")
    floors = layers()
    floor_of = {}
    rooms = []  # per floor: [(package, [(module, lines)])]
    for level, names in enumerate(floors):
        floor = []
        for name in names:
            members = sorted(m for m in graph.modules if m.startswith(name + "."))
            floor_of.update({m: level for m in [name, *members]})
            if not members:  # a module of its own (config)
                members = [name]
            floor.append((name, [(m.rsplit(".", 1)[-1], lines_of(m)) for m in members]))
        rooms.append(floor)
    edges = Counter()
    for module, level in floor_of.items():
        for target in graph.find_modules_directly_imported_by(module):
            if target in floor_of and floor_of[target] != level:
                edges[(level, floor_of[target])] += 1

    width, gap, line = 10.0, 0.15, 0.13
    texts = []  # per floor: [(label, wrapped lines)] and the floor's height
    for floor in rooms:
        share = (width - 0.2) / len(floor)
        rooms_text = []
        for package, members in floor:
            label = package.removeprefix("nbattn.")
            label += "" if len(members) <= 1 else f"  ({len(members)} modules)"
            body = ", ".join(f"{name} {lines}" for name, lines in members)
            rooms_text.append((label, textwrap.wrap(body, width=max(40, int(share * 17)))))
        tallest = max(len(wrapped) for _, wrapped in rooms_text)
        down = sum(1 for s, _ in edges if s == len(texts))
        texts.append((rooms_text, 0.5 + line * max(tallest, down - 2)))
    total = sum(h for _, h in texts) + gap * len(texts)
    fig, ax = plt.subplots(figsize=(13, 1.1 * total + 1.0))
    y = total
    for level, (rooms_text, height) in enumerate(texts):
        y -= height + gap
        ax.add_patch(
            FancyBboxPatch(
                (0, y), width, height, boxstyle="round,pad=0.02", fc="#f3f1ea", ec="#7a7466"
            )
        )
        x = 0.1
        share = (width - 0.2) / len(rooms_text)
        for label, wrapped in rooms_text:
            ax.text(x, y + height - 0.1, label, fontsize=10, weight="bold", va="top")
            ax.text(x, y + height - 0.3, "\n".join(wrapped), fontsize=7, va="top", color="#444")
            x += share
        down = [
            f"→ {names_of(floors[t])}: {n}" for (s, t), n in sorted(edges.items()) if s == level
        ]
        ax.text(
            width + 0.15,
            y + height / 2,
            "\n".join(down) or "imports nothing of nbattn",
            fontsize=7,
            va="center",
            color="#555",
        )
    ax.set_xlim(-0.1, width + 3.2)
    ax.set_ylim(-0.1, total + 0.05)
    ax.axis("off")
    ax.set_title(
        "nbattn's floors (pyproject.toml [tool.importlinter]): each imports only the floors"
        " below it; rooms split by | on one floor do not import each other.\n"
        "Each room lists its modules with their line counts; on the right, the imports from"
        " each floor to each floor below.",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "house.png")
