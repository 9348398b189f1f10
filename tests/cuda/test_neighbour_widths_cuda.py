"""Nearest-neighbour widths on the GPU (simulator) equal their CPU twins.

The kernels: a (query, key) pair's continuous term is log K(r d), r the query's stretch
``q_stretch[i, c]`` (generalised widths) or the key's ``keys_stretch_t[c, j]`` (adaptive
widths), the design keeps d (``nbattn.kernels.local_pairs.stretched_terms``); random
stretches through the first pass, the interval sums and the gradient pass, with three
outputs over two launches (the keys' stretch rows sit after each launch's value rows).
The engine: ``local_polynomial``, ``kernel_density`` and ``local_loo_loss`` with
``bandwidth_type`` and device="cuda" equal device="cpu". Tiny shapes: the simulator
runs every thread in Python.
"""

import os

import numpy as np
import pytest

from nbattn import config
from nbattn._core.local_groups import LocalData, LocalModel
from nbattn.cuda import local as cuda_local
from nbattn.distribution.density import kernel_density
from nbattn.kernels import local as cpu_local
from nbattn.local.engine import local_loo_loss, local_polynomial
from nbattn.local.leaves import exact_leaves

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

KINDS = ("generalized_nn", "adaptive_nn")
NO_STRETCH = np.zeros((0, 0))


def stretched_groups(rng, kind, kernel, degree, n, dc=2, dk=1):
    """(LocalData, LocalModel) of a leave-one-out problem (the queries are the keys) with
    random stretches in [0.5, 2] per query or per key, one categorical column."""
    keys_cont_t = rng.normal(scale=1.0 if kernel == cpu_local.GAUSSIAN else 0.4, size=(dc, n))
    keys_cat_t = rng.integers(0, 3, size=(dk, n)).astype(float)
    stretch = rng.uniform(0.5, 2.0, size=(n, dc))
    lam = rng.uniform(0.1, 0.5, size=dk)
    cat_params = np.column_stack([np.log(1 - lam), np.log(lam / 2), np.zeros(dk)])
    data = LocalData(
        q_cont=np.ascontiguousarray(keys_cont_t.T),
        keys_cont_t=keys_cont_t,
        q_cat=np.ascontiguousarray(keys_cat_t.T),
        keys_cat_t=keys_cat_t,
        log_weights=np.log(rng.uniform(0.5, 2.0, size=n)),
        q_stretch=stretch if kind == "generalized_nn" else NO_STRETCH,
        keys_stretch_t=np.ascontiguousarray(stretch.T) if kind == "adaptive_nn" else NO_STRETCH,
    )
    return data, LocalModel(cat_params, kernel, degree, 1e-5, True, False)


@pytest.mark.parametrize("kernel", [0, 1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_stretched_kernels_equal_cpu(rng, monkeypatch, kind, kernel):
    """First pass, interval sums and gradient pass of the GPU equal the CPU's on random
    stretches (degree 1, leave-one-out, three outputs two per launch)."""
    monkeypatch.setattr(config, "CUDA_MAX_OUTPUTS", 2)
    n = 13
    data, model = stretched_groups(rng, kind, kernel, 1, n)
    values_t = rng.normal(size=(3, n))
    leaves = exact_leaves(data)
    want = cpu_local.local_fit(data, model, values_t, False, leaves)
    got = cuda_local.local_fit(data, model, values_t, False, leaves)
    np.testing.assert_array_equal(got.nearest, want.nearest)
    np.testing.assert_allclose(got.beta, want.beta, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got.g, want.g, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got.shift, want.shift, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got.log_norm, want.log_norm, rtol=1e-10, atol=1e-12)
    # the stretch is applied: the same data with its stretches left out fits otherwise
    plain = data._replace(q_stretch=NO_STRETCH, keys_stretch_t=NO_STRETCH)
    unstretched = cpu_local.local_fit(plain, model, values_t, False, exact_leaves(plain))
    assert not np.allclose(got.beta[:, 0], unstretched.beta[:, 0], rtol=1e-6)
    residuals_t = rng.normal(size=(3, n))
    sums = [m.local_interval_sums(data, model, want, residuals_t) for m in (cuda_local, cpu_local)]
    np.testing.assert_allclose(sums[0], sums[1], rtol=1e-9, atol=1e-14)
    cat_dparams = rng.normal(size=(1, 3))
    out_weights = rng.normal(size=(n, 3))
    grads = [
        m.local_loo_gradient(data, model, want, values_t, cat_dparams, out_weights, leaves)
        for m in (cuda_local, cpu_local)
    ]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-9, atol=1e-11 * np.abs(grads[1]).max())


def _assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_engine_on_the_gpu_equals_the_cpu(rng, launches, kind, degree, kernel):
    """local_polynomial, kernel_density and local_loo_loss with nearest-neighbour widths:
    device="cuda" equals device="cpu", over two random draws (two continuous columns;
    the local-linear Gaussian case with a categorical column too)."""
    calls = launches(cuda_local, "local_fit")
    categorical = degree == 1 and kernel == "gaussian"
    for _ in range(2):
        n, n_q = 16, 5
        X = rng.uniform(-1, 1, (n, 2))
        Q = rng.uniform(-1, 1, (n_q, 2))
        ks = [int(k) for k in rng.integers(3, 7, size=2)]
        options = dict(kernel=kernel, bandwidth_type=kind)
        bandwidth = ks
        if categorical:
            X = np.column_stack([X, rng.integers(0, 3, n)])
            Q = np.column_stack([Q, rng.integers(0, 3, n_q)])
            options |= dict(var_type="ccu", n_categories=[0, 0, 3])
            bandwidth = [*ks, 0.3]
        y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + rng.normal(0, 0.1, n)
        fits = [
            local_polynomial(Q, X, y, bandwidth, degree, device=device, **options)
            for device in ("cuda", "cpu")
        ]
        _assert_close(*fits)
        densities = [
            kernel_density(Q, X, bandwidth, device=device, **options) for device in ("cuda", "cpu")
        ]
        _assert_close(*densities)
        assert np.all(densities[1] > 0) or kernel != "gaussian"  # compact: 0 possible
        losses = [
            local_loo_loss(X, y, bandwidth, degree, device=device, **options)
            for device in ("cuda", "cpu")
        ]
        assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    assert len(calls) == 6  # each device="cuda" call ran the GPU's first pass
