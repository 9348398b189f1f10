"""The one input layer: every refusal, each as a minimal reproducer whose error names the argument.

Add a case here for every new refusal: the smallest call that must fail, and
the words of the message that tell the user which argument to fix.
"""

import numpy as np
import pytest

import nbattn
from nbattn._core import validation as v
from nbattn.attn import flash, positional, scores
from nbattn.attn.softmax import merge_attention_states
from nbattn.smoothing import learned_metric

X = np.arange(6.0).reshape(3, 2)
Y = np.array([1.0, 2.0, 3.0])
Q = np.ones((3, 2))


def _refused(call, *words):
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


# --------------------------------------------------------------------------- flags
@pytest.mark.parametrize("value", ["False", "True", 0, 1, None, np.array([True])])
def test_non_bool_causal_is_refused(value):
    # "False" is truthy: taking it as True would apply a causal mask nobody asked for
    _refused(lambda: nbattn.flash_attention(Q, Q, Q, causal=value), "causal")
    _refused(lambda: nbattn.attention(Q, Q, Q, causal=value), "causal")
    _refused(lambda: nbattn.flash_attention_backward(Q, Q, Q, Q, Q[:, 0], Q, value), "causal")
    _refused(lambda: nbattn.multi_head_attention(Q, Q, Q, 1, causal=value), "causal")


def test_numpy_bools_are_accepted():
    out = nbattn.flash_attention(Q, Q, Q, causal=np.bool_(True))
    np.testing.assert_array_equal(out, nbattn.flash_attention(Q, Q, Q, causal=True))


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: nbattn.nadaraya_watson(X, X, Y, 1.0, exclude_self="yes"), "exclude_self"),
        (lambda: nbattn.flash_attention(Q, Q, Q, return_lse="no"), "return_lse"),
        (lambda: nbattn.attention(Q, Q, Q, return_weights=1), "return_weights"),
        (lambda: positional.rope(np.ones((2, 4)), interleaved="no"), "interleaved"),
        (lambda: nbattn.SelfAttention(4, causal="no"), "causal"),
        (lambda: nbattn.MultiHeadAttention(4, 2, bias="yes"), "bias"),
    ],
)
def test_other_non_bool_flags_are_refused(call, name):
    _refused(call, name)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: nbattn.multi_head_attention(Q, Q, Q, True), "num_heads"),
        (lambda: nbattn.MultiHeadAttention(4.0, 2), "embed_dim"),
        (lambda: positional.sinusoidal(0, 4), "num_positions"),
        (lambda: positional.rope(np.ones((2, 4)), base=float("inf")), "base"),
        (lambda: nbattn.softmax(X, axis=True), "axis"),
        (lambda: nbattn.flash_attention(Q, Q, Q, scale=True), "scale"),
        (lambda: nbattn.flash_attention(Q, Q, Q, scale="0.5"), "scale"),
        (lambda: scores.scaled_dot(Q, Q, scale=float("nan")), "scale"),
        (lambda: positional.sinusoidal(4, 4, dtype="float16"), "dtype"),
        (lambda: nbattn.attention(Q, Q, Q, dtype="int64"), "dtype"),
    ],
)
def test_bad_scalars_are_refused(call, name):
    _refused(call, name)


@pytest.mark.parametrize("bad", ["nope", ["cpu"], np.array(["cpu"]), None, 1])
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda bad: nbattn.flash_attention(Q, Q, Q, device=bad), "device"),
        (lambda bad: nbattn.attention(Q, Q, Q, mode=bad), "mode"),
        (lambda bad: nbattn.flash_attention(Q, Q, Q, causal_alignment=bad), "causal_alignment"),
        (lambda bad: nbattn.local_polynomial(X, X, Y, kernel=bad), "kernel"),
        (lambda bad: nbattn.local_polynomial(X, X, Y, missing=bad), "missing"),
        (lambda bad: learned_metric.fit_learned_kernel(X, Y, metric=bad), "metric"),
    ],
)
def test_a_choice_that_is_not_one_of_the_names_is_refused(call, name, bad):
    # lists and arrays too: a membership test on them would raise a TypeError or
    # an ambiguous-truth error that does not name the argument
    _refused(lambda: call(bad), f"{name} must be one of")


def test_an_unknown_bandwidth_rule_is_refused():
    # a bandwidth that is not a string is a width (checked as one, below)
    _refused(lambda: nbattn.nadaraya_watson(X, X, Y, "widest"), "bandwidth rule must be one of")
    _refused(lambda: nbattn.local_polynomial(X, X, Y, "widest"), "bandwidth rule must be one of")


# --------------------------------------------------------------------------- bandwidths
@pytest.mark.parametrize("bandwidth", [float("nan"), float("inf"), -1.0, 0.0, [1.0, np.nan]])
def test_non_finite_or_non_positive_bandwidth(bandwidth):
    _refused(lambda: nbattn.nadaraya_watson(X, X, Y, bandwidth), "bandwidth")


@pytest.mark.parametrize("bandwidth", [5e-324, 1e-310, [1.0, 2e-308]])
def test_subnormal_bandwidth_is_refused(bandwidth):
    # a subnormal width made every prediction 0
    _refused(lambda: nbattn.nadaraya_watson(X, X, Y, bandwidth), "bandwidth", "subnormal")


@pytest.mark.parametrize("bandwidth, what", [(1e-160, "underflows"), (1e160, "overflows")])
def test_gaussian_score_bandwidth_whose_square_leaves_float64_is_refused(bandwidth, what):
    # the score-matrix and flash forms of the Gaussian score need 1 / h**2
    _refused(lambda: scores.gaussian(Q, Q, bandwidth), "bandwidth", what)


@pytest.mark.parametrize("scale", [1e-170, 1e-300, 1e160, 1e300])
def test_pooling_takes_widths_at_any_normal_scale(scale):
    # the streaming kernels need only 1 / h: data and widths scaled together
    want = nbattn.nadaraya_watson(X, X, Y, 0.7)
    np.testing.assert_allclose(nbattn.nadaraya_watson(X * scale, X * scale, Y, 0.7 * scale), want)


def test_bandwidths_at_the_edges_of_the_range_are_accepted():
    for h in (1.5e-154, 1.3e154):
        np.testing.assert_array_equal(v.check_bandwidth(h, 2, square_representable=True), [h, h])
    for h in (float(np.finfo(np.float64).tiny), 1e300):
        np.testing.assert_array_equal(v.check_bandwidth(h, 2), [h, h])


def test_bandwidth_count_and_type():
    _refused(lambda: v.check_bandwidth([1.0, 2.0, 3.0], 2), "bandwidth", "3 entries")
    _refused(lambda: v.check_bandwidth(True, 2), "bandwidth")
    _refused(lambda: v.check_bandwidth("scott", 2), "bandwidth", "rule")


# --------------------------------------------------------------------------- arrays
def test_object_array_holding_none():
    keys = np.array([[1.0], [None], [2.0]], dtype=object)
    _refused(lambda: nbattn.nadaraya_watson(X[:, :1], keys, Y, 1.0), "keys", "None", "(1, 0)")
    values = np.array([1.0, None, 2.0], dtype=object)
    _refused(lambda: nbattn.nadaraya_watson(X, X, values, 1.0), "values", "None", "(1,)")


def test_object_array_of_numbers_is_accepted():
    values = np.array([1, 2.5, np.float32(3.0)], dtype=object)
    np.testing.assert_array_equal(v.as_float_array(values, "values"), [1.0, 2.5, 3.0])


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda c: nbattn.nadaraya_watson(X, X, c, 1.0), "values"),
        (lambda c: nbattn.attention(c.reshape(3, 1), Q[:, :1], Q), "q"),
        (lambda c: nbattn.flash_attention(Q[:, :1], c.reshape(3, 1), Q), "k"),
        (lambda c: nbattn.softmax(c), "x"),
        (lambda c: scores.dot(c.reshape(3, 1), Q[:, :1]), "q"),
        (lambda c: positional.rope(np.stack([c, c], axis=1)), "x"),
    ],
)
def test_complex_values_are_refused_not_truncated(call, name):
    c = np.array([1 + 2j, 3.0, 4.0])
    _refused(lambda: call(c), name, "complex")
    _refused(lambda: call(c.astype(object)), name, "complex")


@pytest.mark.parametrize(
    "bad, name",
    [
        (np.array(["1.5", "2", "3"]), "must be numeric"),
        (np.array(["2020-01-01", "2020-01-02", "2020-01-03"], dtype="datetime64[D]"), "numeric"),
        (np.array([1.0, "a", 2.0], dtype=object), "type str"),
    ],
)
def test_non_numeric_values_are_refused(bad, name):
    _refused(lambda: nbattn.nadaraya_watson(X, X, bad, 1.0), "values", name)


def test_non_finite_entries_name_the_first_index():
    bad = Y.copy()
    bad[2] = np.nan
    _refused(lambda: nbattn.nadaraya_watson(X, X, bad, 1.0), "values contains NaN", "(2,)")
    _refused(lambda: v.as_float_array([1.0, -np.inf], "lse"), "lse contains NaN or inf")
    assert v.as_float_array([1.0, -np.inf], "lse", allow_neg_inf=True)[1] == -np.inf
    _refused(lambda: v.as_float_array([np.inf], "lse", allow_neg_inf=True), "NaN or +inf")


def test_ragged_empty_and_wrong_dimensions():
    _refused(lambda: v.as_float_array([[1.0], [1.0, 2.0]], "x"), "x could not be converted")
    _refused(lambda: v.as_float_array(np.zeros((0, 2)), "x"), "x is empty")
    _refused(lambda: v.as_float_array(np.zeros(3), "x", ndim=(2,)), "x must be 2-D")
    _refused(lambda: v.as_float_array(np.zeros(3), "x", min_ndim=2), "x must have at least 2")
    _refused(lambda: v.as_float_array([True], "x", allow_bool=False), "x must be a real numeric")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda big: nbattn.nadaraya_watson(X, X, big, 1.0, dtype="float32"), "values"),
        (lambda big: scores.dot(big.reshape(3, 1), Q[:, :1], dtype="float32"), "q"),
        (lambda big: nbattn.attention(Q, Q, big.reshape(3, 1), dtype="float32"), "v"),
    ],
)
def test_float64_values_beyond_float32_are_refused_in_float32(call, name):
    # not inf with a RuntimeWarning
    big = np.array([1e39, 1.0, 2.0])
    _refused(lambda: call(big), name, "beyond the float32 range")
    call(big / 1e10)  # representable: fine


def test_dtype_rule():
    f32 = np.ones(2, np.float32)
    assert v.resolve_dtype(None, f32, f32) is np.float32
    assert v.resolve_dtype(None, f32, np.ones(2)) is np.float64
    assert v.resolve_dtype(None, f32, [1.0]) is np.float64  # a list is float64
    assert v.resolve_dtype("float32", np.ones(2)) is np.float32
    assert v.as_float_array(np.ones(2, np.float16), "x").dtype == np.float64
    assert v.as_float_array(np.ones(2, np.longdouble), "x").dtype == np.float64


def test_leading_dimensions_that_do_not_broadcast_name_every_argument():
    q = np.ones((2, 3, 2))
    k = np.ones((3, 4, 2))
    _refused(lambda: nbattn.attention(q, k, k), "batch", "q (2,)", "k (3,)")


def test_inputs_are_never_modified():
    values = np.array([1.0, None, 2.0], dtype=object)
    copy = values.copy()
    with pytest.raises(ValueError):
        v.as_float_array(values, "values")
    assert values.tolist() == copy.tolist()
    x = np.array([1.0, 2.0])
    out = v.as_float_array(x, "x")
    out[0] = 5.0
    assert x[0] == 1.0


# --------------------------------------------------------------------------- extreme magnitudes
def test_scores_beyond_the_kernels_range_are_refused():
    big = np.full((3, 2), 1e200)
    _refused(lambda: nbattn.flash_attention(big, big, Q), "q and k", "rescale")
    big32 = np.full((3, 2), 1e19, np.float32)
    _refused(lambda: nbattn.flash_attention(big32, big32, Q.astype(np.float32)), "float32")


@pytest.mark.parametrize("score", ["scaled_dot", "gaussian"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_attention_scores_that_overflow_are_refused(score, return_weights):
    # not NaN rows (inf - inf) and not silent zeros
    big = np.array([[1e200, 0.0], [0.0, 1.0], [-1e200, 1.0]])
    _refused(lambda: nbattn.attention(big, big, Q, score, return_weights=return_weights), "q and k")
    mask = np.ones((3, 3), bool)
    _refused(lambda: nbattn.attention(big, big, Q, score, mask=mask), "q and k")


def test_alibi_slopes_beyond_the_kernels_range_are_refused():
    q = np.ones((1, 4, 2))
    _refused(
        lambda: flash.flash_attention_bias(q, q, q, alibi_slopes=np.array([1e307])),
        "alibi_slopes",
    )


def test_key_bias_shape():
    _refused(lambda: flash.flash_attention_bias(Q, Q, Q, key_bias=1.0), "key_bias", "(..., S)")
    _refused(lambda: flash.flash_attention_bias(Q, Q, Q, key_bias=np.ones(2)), "key_bias")


def test_causal_key_bias_spanning_more_than_float64_is_exact():
    # row 0 sees key 0 only; the mask is shifted per row over the keys it may see, so a span
    # of 2e308 between keys is answered exactly, not refused
    q = np.zeros((2, 1))
    v = np.array([[1.0], [2.0]])
    bias = np.array([-1e308, 1e308])
    out, lse = flash.flash_attention_bias(q, q, v, key_bias=bias, causal=True, return_lse=True)
    np.testing.assert_array_equal(out, [[1.0], [2.0]])
    np.testing.assert_array_equal(lse, [-1e308, 1e308])


def test_merge_states_lse():
    out = np.ones((2, 3))
    _refused(lambda: merge_attention_states(out, [np.nan, 0.0], out, [0.0, 0.0]), "lse_a")


# --------------------------------------------------------------------------- layers
def test_load_state_dict_refuses_complex_values():
    layer = nbattn.MultiHeadAttention(4, 2, random_state=0)
    state = layer.state_dict()
    state["in_proj_weight"] = state["in_proj_weight"] + 1j
    _refused(lambda: layer.load_state_dict(state), "in_proj_weight", "complex")


def test_load_state_dict_refuses_unknown_keys():
    layer = nbattn.MultiHeadAttention(4, 2, random_state=0)
    state = {**layer.state_dict(), "out_proj.wieght": np.zeros((4, 4))}
    _refused(lambda: layer.load_state_dict(state), "out_proj.wieght")
    no_bias = nbattn.MultiHeadAttention(4, 2, bias=False, random_state=0)
    _refused(lambda: no_bias.load_state_dict(layer.state_dict()), "in_proj_bias")


@pytest.mark.parametrize(
    "bad",
    [
        {"out_proj.weight": np.zeros((3, 4))},  # shape
        {"out_proj.bias": np.full(4, np.nan)},  # NaN
        {"out_proj.bias": np.full(4, 1j)},  # complex
        {"extra": np.zeros(1)},  # unknown key
    ],
)
def test_load_state_dict_is_all_or_nothing(bad):
    layer = nbattn.MultiHeadAttention(4, 2, random_state=0)
    before = layer.state_dict()
    new = {name: value + 1.0 for name, value in before.items()}
    with pytest.raises(ValueError):
        layer.load_state_dict({**new, **bad})
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize(
    ("call", "bad", "plain"),
    [
        (lambda x: v.check_positive_int(x, "n"), np.int64(0), "got 0"),
        (lambda x: v.check_positive_float(x, "h"), np.float64(-2.5), "got -2.5"),
        (lambda x: v.check_scale(x, 4), np.float64(np.inf), "got inf"),
        (lambda x: v.check_bandwidth(x, 2), np.array([1.0, -1.0]), "got [ 1., -1.]"),
    ],
)
def test_numpy_values_are_shown_plainly(call, bad, plain):
    """A NumPy scalar in an error message reads as the number it holds, not its repr."""
    with pytest.raises(ValueError) as info:
        call(bad)
    message = str(info.value)
    assert plain in message and "np." not in message and "array(" not in message, message


def test_the_columns_messages_show_values_plainly_and_count_rows_from_0():
    from nbattn._core import columns

    X = np.array([[1.0, 0.0], [2.0, 1.0], [np.nan, 1.0]])
    with pytest.raises(ValueError) as info:
        columns.encode_columns(X, "cu", [None, [0.0, 1.0]])
    assert "missing value (nan) in row 2 (counting from 0)" in str(info.value)
    with pytest.raises(ValueError) as info:
        columns.encode_columns(X[:2] + [0, 1], "cu", [None, [0.0, 1.0]])
    message = str(info.value)
    assert "the category 2.0 (row 1, counting from 0)" in message and "np." not in message
