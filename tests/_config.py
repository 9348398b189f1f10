"""``config_values(NAME=value, ...)``: nbattn.config values set inside a ``with`` block
and restored after it (hypothesis tests cannot take pytest's monkeypatch)."""

import contextlib

from nbattn import config


@contextlib.contextmanager
def config_values(**values):
    saved = {name: getattr(config, name) for name in values}
    for name, value in values.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)
