"""Checks for the exercises of lecture 7 (gradient compression); they run in the notebook's process.

* 7.1 ``int8_quantize(g) -> (q, m)``: source 000's int8 max-abs, compared bit for bit with
  :func:`~course_lib.compression.int8.int8_encode` on gradients of several shapes and scales;
* 7.2 ``error_feedback_step(g, residual, quantize) -> (sent, residual)``: one step of error
  feedback; checked by the running sum (sent + residual = sum of gradients) and step by step;
* 7.3 ``top_k(g, k) -> (indices, values)``: the k values largest in magnitude.

While the student's function runs, the library's codec, error feedback and top-k refuse to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports them to teach from them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.compression.int8 import int8_decode, int8_encode
from course_lib.i18n import N_, _

__all__ = [
    "REFUSED",
    "check_error_feedback",
    "check_int8_quantize",
    "check_top_k",
    "stub_error_feedback_step",
    "stub_int8_quantize",
    "stub_top_k",
]


REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "7.1": {
        "course_lib.compression.int8.int8_encode": N_(
            "compute m = max|g| and the int8 cast yourself"
        )
    },
    "7.2": {
        "course_lib.compression.error_feedback.ErrorFeedback.compress": N_(
            "add the residual, compress with quantize, keep what was not sent"
        )
    },
    "7.3": {
        "course_lib.compression.sparse.TopK.compress": N_(
            "find the k largest |g| with NumPy (np.argpartition or np.argsort)"
        )
    },
}


def stub_int8_quantize(g: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """The released stub of Exercise 7.1."""
    raise NotImplementedError("Exercise 7.1: return (q, m) with m = max|g|, q = int8(g / m * 127)")


def stub_error_feedback_step(g, residual, quantize):  # noqa: ANN001, ANN201
    """The released stub of Exercise 7.2."""
    raise NotImplementedError("Exercise 7.2: compress g + residual, return (sent, new residual)")


def stub_top_k(g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The released stub of Exercise 7.3."""
    raise NotImplementedError("Exercise 7.3: return the indices and values of the k largest |g|")


def _gradients() -> list[np.ndarray]:
    rng = np.random.default_rng(70)
    return [
        rng.standard_normal(1000).astype(np.float32) * 1e-3,
        (rng.standard_normal(5000) ** 3).astype(np.float32),  # heavy tails: most q are 0
        np.array([0.5, -2.0, 0.25, 0.003, 2.0], np.float32),  # 31.75 must truncate to 31
        np.array([-1.0], np.float32),
        np.zeros(7, np.float32),  # max 0: every q is 0, nothing to divide by
    ]


def _int8_body(fn: Callable) -> str:
    for g in _gradients():
        with refusing(REFUSED["7.1"], fn):
            q, m = fn(g.copy())
        want_q, want_m = int8_encode(g)
        q = np.asarray(q)
        assert q.dtype == np.int8, _(
            "q has dtype {dtype}: cast to np.int8 (1 byte a value)"
        ).format(dtype=q.dtype)
        assert q.shape == g.shape, _("q has shape {got}, the gradient {want}").format(
            got=q.shape, want=g.shape
        )
        assert np.float32(m) == want_m, _("m = {m}, expected max|g| = {want}").format(
            m=m, want=want_m
        )
        if not np.array_equal(q, want_q):
            i = int(np.flatnonzero(q != want_q)[0])
            raise AssertionError(
                _(
                    "q[{i}] = {q} for g = {g}, expected {want} = int8(g / m * 127) "
                    "(float32 arithmetic, and the cast truncates toward zero)"
                ).format(i=i, q=q[i], g=repr(g[i]), want=want_q[i])
            )
    return _("5 gradients, bit for bit, zeros included")


def check_int8_quantize(fn: Callable) -> Verdict:
    """Check ``fn(g) -> (q, m)`` against source 000's formula bit for bit; print the verdict."""
    return run_check("7.1", "int8 max-abs", lambda: _int8_body(fn))


def _int8_roundtrip(x: np.ndarray) -> np.ndarray:
    return int8_decode(*int8_encode(x))


def _top1(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    i = int(np.argmax(np.abs(x)))
    out[i] = x[i]
    return out


def _ef_body(fn: Callable) -> str:
    rng = np.random.default_rng(71)
    for quantize, name in ((_int8_roundtrip, "int8"), (_top1, "top-1")):
        residual = np.zeros(50, np.float32)
        total_g, total_sent = np.zeros(50), np.zeros(50)
        for step in range(40):
            g = rng.standard_normal(50).astype(np.float32)
            want_sent = quantize(g + residual)
            with refusing(REFUSED["7.2"], fn):
                sent, new_residual = fn(g.copy(), residual.copy(), quantize)
            assert np.allclose(sent, want_sent, atol=1e-6), _(
                "{name}, step {step}: sent differs from quantize(g + residual)"
            ).format(name=name, step=step)
            residual = np.asarray(new_residual, np.float32)
            total_g += g
            total_sent += sent
        gap = np.abs(total_sent + residual - total_g).max()
        assert gap < 1e-4, _(
            "{name}: after 40 steps sum(sent) + residual is off the sum of gradients by "
            "{gap}: the residual must keep exactly what was not sent"
        ).format(name=name, gap=f"{gap:.2e}")
    return _("int8 and top-1, 40 steps: sent + residual = sum of gradients")


def check_error_feedback(fn: Callable) -> Verdict:
    """Check ``fn(g, residual, quantize) -> (sent, residual)`` by its running sum; print it."""
    return run_check("7.2", "error feedback", lambda: _ef_body(fn))


def _top_k_body(fn: Callable) -> str:
    rng = np.random.default_rng(72)
    for n, k in ((100, 1), (1000, 10), (64, 64), (5, 3)):
        g = rng.standard_normal(n).astype(np.float32)
        with refusing(REFUSED["7.3"], fn):
            idx, values = fn(g.copy(), k)
        idx, values = np.asarray(idx).astype(np.int64), np.asarray(values)
        assert idx.size == k and values.size == k, _("n={n}, k={k}: got {got} indices").format(
            n=n, k=k, got=idx.size
        )
        assert len(set(idx.tolist())) == k, _("n={n}, k={k}: indices repeat").format(n=n, k=k)
        assert np.array_equal(values, g[idx]), _(
            "values must be g at the indices (with their sign)"
        )
        want = np.sort(np.abs(g))[-k:]
        assert np.array_equal(np.sort(np.abs(values)), want), _(
            "n={n}, k={k}: these are not the {k} largest magnitudes"
        ).format(n=n, k=k)
    return _("4 sizes, k = 1..64")


def check_top_k(fn: Callable) -> Verdict:
    """Check ``fn(g, k) -> (indices, values)`` keeps the k largest magnitudes; print it."""
    return run_check("7.3", "top-k", lambda: _top_k_body(fn))
