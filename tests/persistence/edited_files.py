"""Model files opened and edited by hand, as a user (or an attacker) would: the members
read out, changed, and written back with a checksum that matches the edit."""

import json

import numpy as np

from nbattn.persistence import modelfile


def split(path):
    """(metadata dict, {member name: array}) of the model file at ``path``."""
    with np.load(path, allow_pickle=False) as npz:
        members = {k: npz[k] for k in npz.files}
    return json.loads(str(members.pop("__nbattn__"))), members


def rewrite(path, meta, arrays):
    """Write ``meta`` and ``arrays`` back to ``path`` with a recomputed checksum (anyone
    can recompute it: an edit, not an accident)."""
    meta = dict(meta)
    meta["sha256"] = modelfile._digest(meta, arrays)
    with open(path, "wb") as fh:
        np.savez(fh, __nbattn__=np.array(json.dumps(meta)), **arrays)
