"""The one source of the version: nbattn/__init__.py re-exports it and pyproject.toml reads it."""

__version__ = "0.1.0"
