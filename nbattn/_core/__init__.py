"""Plumbing every layer may use: input checks, layouts, thread limits, progress, atomic
writes, column kinds and numeric helpers. Imports nothing of nbattn but ``config``."""
