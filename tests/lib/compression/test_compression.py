"""Gradient compressors, error feedback, codecs and the wire format, without engines.

Property tests (hypothesis) over shapes, dtypes and values; statistical tests of unbiasedness
with fixed seeds (so they cannot flake) and a tolerance of 6 standard errors computed from each
compressor's variance bound; exact tests of source 000's int8 formula and of every codec.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from course_lib.compression import (
    CODECS,
    COMPRESSORS,
    ErrorFeedback,
    PayloadError,
    make_codec,
    make_compressor,
    pack,
    pack_many,
    unpack,
    unpack_many,
)
from course_lib.compression.int8 import int8_decode, int8_encode

SETTINGS = {"threshold": {"threshold": 0.5}, "topk": {"ratio": 0.1}, "randomk": {"ratio": 0.1}}
QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(name: str, **kw) -> object:
    return make_compressor(name, **{**SETTINGS.get(name, {}), **kw})


def gradients(dtype=np.float32, max_side: int = 12):
    """Arrays of 0-3 dimensions, with values like gradients (finite, within float16's range)."""
    return hnp.arrays(
        dtype,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side),
        elements=st.floats(-100, 100, width=16 if dtype == np.float16 else 32),
    )


def roundtrip(comp, g, codec: str = "none"):
    payload, ctx = comp.compress(g, "w")
    received, _ = unpack(pack(payload, make_codec(codec)))
    return comp.decompress(received, None), payload


# ---- shape and dtype ------------------------------------------------------------------------


@QUICK
@given(
    data=st.data(),
    name=st.sampled_from(sorted(COMPRESSORS)),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    as_torch=st.booleans(),
)
def test_decompress_keeps_shape_and_dtype(data, name, dtype, as_torch):
    g = data.draw(gradients(dtype))
    x = torch.from_numpy(g.copy()) if as_torch else g
    out, _ = roundtrip(make(name), x)
    assert isinstance(out, np.ndarray) and out.shape == g.shape and out.dtype == g.dtype


def test_non_float_input_is_refused_with_advice():
    with pytest.raises(TypeError, match=r"convert it with \.float\(\)"):
        make("int8").compress(torch.zeros(3, dtype=torch.int64))


# ---- error bounds ---------------------------------------------------------------------------


@QUICK
@given(g=gradients())
def test_error_bounds_of_each_quantiser(g):
    g = g.reshape(-1)
    m = float(np.abs(g).max(initial=0.0))
    norm = float(np.linalg.norm(g))
    slack = 1e-5 * m + 1e-30
    assert np.array_equal(roundtrip(make("none"), g)[0], g)
    half = roundtrip(make("float16"), g)[0]
    assert np.all(np.abs(half - g) <= 2.0**-11 * np.abs(g) + 2.0**-25)
    err = np.abs(roundtrip(make("int8"), g)[0] - g)
    assert np.all(err <= m / 127 + slack)  # truncation: less than one step
    err = np.abs(roundtrip(make("int8", rounding="nearest"), g)[0] - g)
    assert np.all(err <= m / 254 + slack)  # rounding: half a step
    for s in (1, 7, 127):
        err = np.abs(roundtrip(make("qsgd", levels=s, seed=s), g)[0] - g)
        assert np.all(err <= norm / s * (1 + 1e-5) + 1e-30), s
    signed = roundtrip(make("sign"), g)[0]
    scale = np.float32(np.abs(g).mean()) if g.size else 0.0
    assert np.all(np.abs(signed) == scale)
    assert scale == 0 or np.array_equal(signed < 0, g < 0)


@QUICK
@given(g=gradients(), t=st.floats(0, 50), ratio=st.floats(0.01, 1))
def test_sparsifiers_keep_what_they_promise(g, t, ratio):
    g = g.reshape(-1)
    out, payload = roundtrip(make("threshold", threshold=t), g)
    kept = np.abs(g) > np.float32(t)
    assert np.array_equal(out[kept], g[kept]) and np.all(out[~kept] == 0)
    out, payload = roundtrip(make("topk", ratio=ratio), g)
    k = payload.parts["indices"].size
    assert k == (min(g.size, max(1, int(np.ceil(ratio * g.size)))) if g.size else 0)
    idx = payload.parts["indices"].astype(np.int64)
    assert np.array_equal(out[idx], g[idx])  # kept values are exact
    dropped = np.setdiff1d(np.arange(g.size), idx)
    if k and dropped.size:  # nothing dropped is larger than anything kept
        assert np.abs(g[dropped]).max() <= np.abs(g[idx]).min()


# ---- unbiasedness ---------------------------------------------------------------------------


def mean_over_draws(comp, g, draws: int) -> np.ndarray:
    total = np.zeros(g.size, np.float64)
    for _ in range(draws):
        total += roundtrip(comp, g)[0]
    return total / draws


@pytest.mark.parametrize("levels", [1, 4])
def test_qsgd_is_unbiased_over_seeds(levels):
    g = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    draws = 4000
    mean = mean_over_draws(make("qsgd", levels=levels, seed=7), g, draws)
    # One value's variance is p (1 - p) (norm / s)^2 <= (norm / s)^2 / 4 (Alistarh et al. 2017).
    stderr = np.linalg.norm(g) / levels / 2 / np.sqrt(draws)
    assert np.abs(mean - g).max() <= 6 * stderr, np.abs(mean - g).max() / stderr


def test_randomk_is_unbiased_over_seeds():
    g = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    draws, n, k = 4000, 64, 8
    mean = mean_over_draws(make("randomk", ratio=k / n, seed=3), g, draws)
    # Each value is sent with probability k / n, scaled by n / k: variance g^2 (n / k - 1).
    stderr = np.abs(g) * np.sqrt((n / k - 1) / draws)
    assert np.all(np.abs(mean - g) <= 6 * stderr + 1e-6)


def test_stochastic_compressors_differ_by_stream_and_repeat_by_seed():
    g = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    a, b, c = make("qsgd", seed=1), make("qsgd", seed=1), make("qsgd", seed=1)
    c.reseed(1)
    qa, qb, qc = (x.compress(g)[0].parts["q"] for x in (a, b, c))
    assert np.array_equal(qa, qb) and not np.array_equal(qa, qc)


# ---- error feedback -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["int8", "topk", "sign", "threshold", "qsgd"])
def test_error_feedback_keeps_the_running_sum(name):
    rng = np.random.default_rng(4)
    comp = make(name, error_feedback=True)
    shapes = {"a": (7, 5), "b": (13,)}
    inputs = {k: np.zeros(s, np.float64) for k, s in shapes.items()}
    sent = {k: np.zeros(s, np.float64) for k, s in shapes.items()}
    for _ in range(30):
        for key, shape in shapes.items():
            g = rng.standard_normal(shape).astype(np.float32)
            payload, ctx = comp.compress(g, key)
            inputs[key] += g
            sent[key] += comp.decompress(unpack(pack(payload))[0], ctx)
    for key in shapes:  # what was not sent is still in the residual: nothing is lost
        residual = comp.residuals[key].reshape(shapes[key])
        assert np.allclose(sent[key] + residual, inputs[key], atol=1e-4), name
    if name == "topk":  # and top-k would have lost most of it without the memory
        assert np.abs(sent["a"] - inputs["a"]).max() > 0.1


def test_error_feedback_refuses_a_tensor_that_changed_size():
    comp = make("int8", error_feedback=True)
    comp.compress(np.ones(4, np.float32), "w")
    with pytest.raises(ValueError, match="call reset"):
        comp.compress(np.ones(5, np.float32), "w")
    with pytest.raises(ValueError, match="only once"):
        ErrorFeedback(comp)


def test_momentum_correction_without_compression_is_momentum_sgd():
    # DGC (Lin et al. 2018): velocity on the rank, plain SGD on what arrives == momentum SGD.
    rng = np.random.default_rng(7)
    grads = [torch.from_numpy(rng.standard_normal(6).astype(np.float32)) for _ in range(12)]
    theirs, ours = torch.zeros(6, requires_grad=True), torch.zeros(6, requires_grad=True)
    momentum_sgd = torch.optim.SGD([theirs], lr=0.1, momentum=0.9)
    plain_sgd = torch.optim.SGD([ours], lr=0.1)
    comp = ErrorFeedback(make("none"), momentum=0.9)
    for g in grads:
        theirs.grad = g.clone()
        momentum_sgd.step()
        payload, ctx = comp.compress(g, "w")
        ours.grad = torch.from_numpy(comp.decompress(payload, ctx))
        plain_sgd.step()
    assert torch.equal(theirs, ours)
    assert not torch.equal(ours, -0.1 * torch.stack(grads).sum(0))  # momentum did act


@pytest.mark.parametrize("name", ["int8", "topk"])
def test_momentum_correction_keeps_the_running_sum_of_velocities(name):
    rng = np.random.default_rng(8)
    comp, mu = make(name, error_feedback=True, momentum_correction=0.5), 0.5
    velocity, velocities, sent = np.zeros(40), np.zeros(40), np.zeros(40)
    for _ in range(25):
        g = rng.standard_normal(40).astype(np.float32)
        velocity = mu * velocity + g  # u_t = mu u_{t-1} + g_t, from the formula
        velocities += velocity
        payload, ctx = comp.compress(g, "w")
        sent += comp.decompress(payload, ctx)
    assert np.allclose(sent + comp.residuals["w"], velocities, atol=1e-4)
    assert np.abs(sent - velocities).max() > 5e-3  # something was held back


def test_momentum_factor_masking_restarts_the_velocity_of_sent_values():
    comp = ErrorFeedback(make("topk", ratio=0.25), momentum=0.9, masking=True)
    g = np.array([4.0, 1.0, 0.5, 0.25], np.float32)
    payload, ctx = comp.compress(g, "w")
    assert comp.decompress(payload, ctx).tolist() == [4.0, 0.0, 0.0, 0.0]
    assert comp.velocities["w"].tolist() == [0.0, 1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match=r"momentum=1.0: .* in \[0, 1\)"):
        ErrorFeedback(make("int8"), momentum=1.0)
    with pytest.raises(ValueError, match="add error_feedback=True"):
        make_compressor("int8", momentum_correction=0.9)


# ---- source 000's int8, bit for bit ---------------------------------------------------------


@QUICK
@given(g=gradients(max_side=40))
def test_int8_matches_source000_formula_bit_for_bit(g):
    t = torch.from_numpy(g.reshape(-1).copy())
    m = t.abs().max() if t.numel() else torch.tensor(0.0)
    want_q = (t / m * 127).to(torch.int8) if float(m) else torch.zeros(t.numel(), dtype=torch.int8)
    want = want_q.float() / 127 * m  # decode multiplies back by the maximum
    _, payload = roundtrip(make("int8"), g)
    assert np.array_equal(payload.parts["q"], want_q.numpy())
    assert payload.parts["scale"][0] == np.float32(m)
    got = make("int8").decompress(payload).reshape(-1)
    assert np.array_equal(got, want.numpy()) or not float(m)


def test_int8_worked_example():
    q, m = int8_encode(np.array([0.5, -2.0, 0.25, 0.003, 2.0], np.float32))
    assert m == 2.0 and q.tolist() == [31, -127, 15, 0, 127]  # 31.75 -> 31: the cast truncates
    assert int8_decode(q, m)[1] == -2.0  # multiplied by m; dividing would give -0.5


# ---- codecs and the wire format ---------------------------------------------------------------


@QUICK
@given(
    data=st.binary(max_size=5000),
    codec=st.sampled_from(sorted(CODECS)),
    level=st.sampled_from([None, 1, 6]),
)
def test_every_codec_round_trips_bytes_exactly(data, codec, level):
    c = make_codec(codec, level=level)
    assert c.decode(c.encode(data), len(data)) == data


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_int8_gradient_through_every_codec_is_exact_and_smaller(codec):
    g = (np.random.default_rng(5).standard_normal(20000) ** 3).astype(np.float32)  # heavy tails
    comp = make("int8")
    payload, _ = comp.compress(g)
    frame = pack(payload, make_codec(codec))
    back = unpack(frame)[0]
    assert np.array_equal(back.parts["q"], payload.parts["q"])
    if codec != "none":  # most values round to zero: the codec finds that sparsity
        assert len(frame) < 0.6 * payload.nbytes


def test_several_frames_in_one_message():
    comp = make("qsgd")
    payloads = [comp.compress(np.full(s, s, np.float32), str(s))[0] for s in (1, 5, 9)]
    frames = pack_many(payloads, make_codec("zlib"))
    back = unpack_many(np.frombuffer(frames + b"\0" * 0, np.uint8), 3)
    assert [p.shape for p in back] == [(1,), (5,), (9,)]
    with pytest.raises(PayloadError, match="bytes left after"):
        unpack_many(frames + b"\0\0", 3)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_corrupt_byte_and_every_truncation_is_a_clear_error(codec):
    g = np.linspace(-1, 1, 40, dtype=np.float32)
    frame = pack(make("int8").compress(g)[0], make_codec(codec))
    for i in range(len(frame)):
        bad = bytearray(frame)
        bad[i] ^= 0x5A
        with pytest.raises(PayloadError, match="corrupt|truncated|not a gradient|version"):
            unpack(bytes(bad))
    for n in range(len(frame)):
        with pytest.raises(PayloadError, match="truncated|not a gradient"):
            unpack(frame[:n])


def test_error_messages_name_what_is_wrong():
    frame = pack(make("int8").compress(np.ones(10, np.float32))[0])
    with pytest.raises(PayloadError, match=r"truncated: its header announces \d+ bytes, only"):
        unpack(frame[:-3])
    body_byte = bytearray(frame)
    body_byte[-6] ^= 1
    with pytest.raises(PayloadError, match=r"body of int8 \(10,\) is corrupt"):
        unpack(bytes(body_byte))
    with pytest.raises(PayloadError, match="b'CLGC'"):
        unpack(b"GARBAGE-" + frame)
    with pytest.raises(PayloadError, match="'int8' payload given to the 'topk'"):
        make("topk").decompress(unpack(frame)[0])


# ---- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "advice"),
    [
        (lambda: make_compressor("int9"), "choose one of none, float16, int8"),
        (lambda: make_compressor("topk", ratio=0), r"0 < ratio <= 1 \(0.01 sends 1 %"),
        (lambda: make_compressor("topk", k=5), "has no setting k: it takes ratio, seed"),
        (lambda: make_compressor("float16", levels=3), "it takes no settings"),
        (lambda: make_compressor("qsgd", levels=300), "1..127 levels"),
        (lambda: make_compressor("qsgd", bucket=0), "values per norm must be an integer >= 1"),
        (lambda: make_compressor("threshold", threshold=-1), "finite t >= 0"),
        (lambda: make_compressor("int8", rounding="up"), "'truncate'"),
        (lambda: make_compressor("sign", scale="max"), "EF-signSGD"),
        (lambda: make_codec("lz4"), "choose one of none, zlib, zstd, mgzip"),
        (lambda: make_codec("zlib", level=12), "zlib level must be 0..9"),
        (lambda: make_codec("zstd", level=99), "1 is the usual choice"),
        (lambda: make_codec("mgzip", block_size=10), "at least 4096 bytes"),
    ],
)
def test_bad_settings_give_advice(call, advice):
    with pytest.raises(ValueError, match=advice):
        call()


def test_values_no_format_can_carry_are_refused():
    with pytest.raises(ValueError, match="use compressor 'int8'"):
        make("float16").compress(np.array([1e6], np.float32), "big")
    with pytest.raises(ValueError, match=r"gradient w: the gradient holds inf or NaN values; int8"):
        make("int8").compress(np.array([1.0, np.nan], np.float32), "w")


# ---- lecture 7's exercise checks --------------------------------------------------------------


def test_lecture07_checks_pass_the_reference_and_fail_stubs_and_wrong_answers():
    from course_lib.checks import lecture07 as ch

    def reference_ef(g, residual, quantize):
        sent = quantize(g + residual)
        return sent, g + residual - sent

    def top_k(g, k):
        idx = np.argsort(np.abs(g))[-k:]
        return idx, g[idx]

    from lecture07_answers import my_int8_quantize  # the check refuses int8_encode itself

    assert ch.check_int8_quantize(my_int8_quantize)
    assert ch.check_error_feedback(reference_ef)
    assert ch.check_top_k(top_k)
    for check, stub in (
        (ch.check_int8_quantize, ch.stub_int8_quantize),
        (ch.check_error_feedback, ch.stub_error_feedback_step),
        (ch.check_top_k, ch.stub_top_k),
    ):
        assert not check(stub)
    rounding = lambda g: int8_encode(g, "nearest")  # noqa: E731 - not the source's cast
    no_memory = lambda g, r, quantize: (quantize(g), r)  # noqa: E731 - forgets the residual
    smallest = lambda g, k: (np.argsort(np.abs(g))[:k], g[np.argsort(np.abs(g))[:k]])  # noqa: E731
    assert not ch.check_int8_quantize(rounding)
    assert not ch.check_error_feedback(no_memory)
    assert not ch.check_top_k(smallest)


def test_a_well_formed_frame_with_a_nonsense_header_is_refused():
    import json
    import struct
    import zlib

    text = json.dumps({"kind": "int8", "shape": [2], "codec": "none", "body": 0}).encode()
    head = struct.pack("<4sBI", b"CLGC", 1, len(text)) + text  # no "parts", no "raw"
    frame = head + struct.pack("<I", zlib.crc32(head)) + struct.pack("<I", zlib.crc32(b""))
    with pytest.raises(PayloadError, match="unreadable parts"):
        unpack(frame)
