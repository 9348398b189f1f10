"""The tunables: one section each, one defaults table, a reset that restores it."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from nbattn import config


def _assigned_tunables() -> list[str]:
    tree = ast.parse(Path(config.__file__).read_text())
    return [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_")
    ]


def test_every_tunable_is_in_exactly_one_section():
    in_sections = [name for names in config.SECTIONS.values() for name in names]
    assert len(in_sections) == len(set(in_sections))
    derived = {"SECTIONS", "DEFAULTS", "CACHE"}  # the tables themselves, and the cache switch
    assert set(_assigned_tunables()) - derived == set(in_sections)
    assert set(config.DEFAULTS) == set(in_sections)


def test_reset_restores_the_defaults(monkeypatch):
    before = {name: copy.copy(getattr(config, name)) for name in config.DEFAULTS}
    monkeypatch.setattr(config, "KEY_BLOCK", config.KEY_BLOCK + 7)
    monkeypatch.setattr(config, "LOO_RTOL", 0.5)
    config.FASTMATH.add("nnan")  # an in-place edit of the one mutable value
    try:
        config.reset("KEY_BLOCK")
        assert config.KEY_BLOCK == before["KEY_BLOCK"] and config.LOO_RTOL == 0.5
        config.reset()
        assert {name: getattr(config, name) for name in config.DEFAULTS} == before
        assert "nnan" not in config.FASTMATH
    finally:
        config.reset()


def test_reset_names_an_unknown_tunable():
    with pytest.raises(ValueError, match="unknown tunable 'KEY_BLOK'"):
        config.reset("KEY_BLOK")
