"""The exchange's part of assignment A5's checks: error feedback, compressor objects, training.

A5.4 checks error feedback step by step and by its running sum (what is not sent now is sent
later) around the block formats of :func:`course_grader.assignments.a5.collect.inner_compressor`
(the very compressors the answer wraps);
A5.5 sends the student's compressor objects' payloads through the wire format; A5.6 trains on
real engines through the kit's compressed exchange, which must reach the float32 run's test
accuracy (at most :data:`A5_ACCURACY_SLACK` point less beyond the noise of the test images, a
paired test: :func:`accuracy_loss`) in the same steps. What the answer does is
collected as data by :mod:`course_grader.assignments.a5.collect` (in the notebook's kernel,
or in the graded kernel by the grader's probe); the bodies here judge that data, return the
verdict's detail or raise :class:`AssertionError` with what is wrong, and
:mod:`course_grader.assignments.a5.checks` turns them into verdicts. ``seed`` None gives the
checks' own inputs; the grader passes a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_grader.assignments.a5.collect import (
    A5_BLOCK,
    A5_CONFIG,
    EF_PROBE_CALLS,
    EF_PROBE_SMALL,
    inner_compressor,
)
from course_lib.i18n import N_, _

__all__ = [
    "A5_ACCURACY_SLACK",
    "A5_Z",
    "accuracy_loss",
    "A5_BLOCK",
    "A5_CONFIG",
    "block_int8_bytes",
    "block_topk_bytes",
    "blocks",
    "compressor_cases",
    "compressors_body",
    "error_feedback_body",
    "error_feedback_cases",
    "reference_decode",
    "reference_encode",
    "reference_topk",
    "training_body",
]

#: test-accuracy points block int8 + error feedback may lose against float32 in the same steps,
#: beyond the noise of the 297 test images (:func:`accuracy_loss`)
A5_ACCURACY_SLACK = 1.0
#: one-sided 95 %: a loss fails only when it exceeds the slack by this many standard errors
A5_Z = 1.645
_EF_STEPS = 30
_EF_NAMES = {"fc1.weight": 48, "fc1.bias": 16}


def _rng(default: int, seed: int | None) -> np.random.Generator:
    """The checks' own inputs (``seed`` None, as in the notebook), or the grader's fresh ones."""
    return np.random.default_rng(default if seed is None else [seed, default])


def error_feedback_cases(seed: int | None = None) -> list[dict]:
    """A5.4's cases: an inner compressor and its gradients, tensor names interleaved, in order."""
    rng = _rng(504, seed)
    cases = []
    inners = ((N_("block int8"), "int8", 8, 0), (N_("block top-2"), "topk", 16, 2))
    for label, kind, block, k in inners:
        names, gradients = [], []
        for step in range(1, _EF_STEPS + 1):
            for name, size in _EF_NAMES.items():  # two tensors, interleaved: one memory per name
                names.append(name)
                gradients.append((rng.standard_normal(size) * (1 + step % 3)).astype(np.float32))
        cases.append(
            {
                "label": label,
                "kind": kind,
                "block": block,
                "k": k,
                "names": names,
                "gradients": gradients,
            }
        )
    return cases


def error_feedback_body(collect: Callable[[dict], list], seed: int | None = None) -> str:
    """A5.4's judge: ``collect(case)`` (what each call sent) is compress(g + residual) by name."""
    for case in error_feedback_cases(seed):
        label = _(case["label"])
        inner = inner_compressor(case["kind"], int(case["block"]), int(case["k"]))
        sent_all = collect(case)
        residual = {n: np.zeros(size, np.float32) for n, size in _EF_NAMES.items()}
        total_g = {n: np.zeros(size) for n, size in _EF_NAMES.items()}
        total_sent = {n: np.zeros(size) for n, size in _EF_NAMES.items()}
        calls = list(zip(case["names"], case["gradients"], strict=True))
        assert isinstance(sent_all, list) and len(sent_all) == len(calls), _(
            "the wrapper's results do not come one per call"
        )
        for i, ((name, g), sent) in enumerate(zip(calls, sent_all, strict=True)):
            step = i // len(_EF_NAMES) + 1
            corrected = g + residual[name]
            want = inner.decode_values(inner.compress(corrected, name)[0])
            residual[name] = corrected - want
            sent = np.asarray(sent, np.float32)
            total_g[name] += g
            total_sent[name] += sent
            if np.array_equal(sent, want):
                continue
            if step == 1:
                raise AssertionError(
                    _(
                        "{label}, {name}, step 1: the payload is not compress(g) (no residual "
                        "yet): compress g + residual with the inner compressor"
                    ).format(label=label, name=repr(name))
                )
            gap = float(np.abs(total_g[name] - total_sent[name]).max())
            held = float(np.abs(residual[name]).max())
            raise AssertionError(
                _(
                    "{label}, {name}, step {step}: the payload is not compress(g + residual). "
                    "After {step} steps sum(g) - sum(sent) should be the residual (at most "
                    "{held} here), it is {gap}: keep residual = (g + residual) - sent, "
                    "one per tensor name, in float32"
                ).format(
                    label=label, name=repr(name), step=step, held=f"{held:.3g}", gap=f"{gap:.3g}"
                )
            )
    return _(
        "block int8 and block top-2, 2 tensors, {steps} steps: sent + residual = sum of g"
    ).format(steps=_EF_STEPS)


def compressor_cases(seed: int | None = None) -> list[dict]:
    """A5.5's cases: the same gradient through each compressor: its payload, then the wire."""
    g = (_rng(550, seed).standard_normal(300) ** 3).astype(np.float32)
    return [
        {"kind": kind, "block": 32, "k": k, "g": g, "stage": stage}
        for kind, k in (("int8", 0), ("topk", 3))
        for stage in ("payload", "wire")
    ]


def compressors_body(collect: Callable[[dict], tuple], seed: int | None = None) -> str:
    """A5.5's judge: ``collect(case)`` -> (class, bytes, payload kind), then (decoded,)."""
    names = set()
    label = ""
    for case in compressor_cases(seed):
        g, block, k = case["g"], case["block"], case["k"]
        result = collect(case)
        assert isinstance(result, tuple), _("the compressor returned no data")
        if case["stage"] == "payload":
            assert len(result) == 3, _("the compressor returned no data")
            label, sent, kind = str(result[0]), int(np.asarray(result[1])), result[2]
            if case["kind"] == "int8":
                nbytes, layout = (
                    block_int8_bytes(g.size, block),
                    _("int8 + one float32 scale per block"),
                )
            else:
                nbytes = block_topk_bytes(g.size, block, k)
                layout = _("a uint32 index and a float32 value per kept value")
            assert sent == nbytes, _(
                "{label} sends {sent} bytes for {n} values in blocks of {block}, "
                "expected {want}: {layout}"
            ).format(label=label, sent=sent, n=g.size, block=block, want=nbytes, layout=layout)
            names.add(str(kind))
            continue
        if case["kind"] == "int8":
            want = reference_decode(*reference_encode(g, block), block)
        else:
            ref = inner_compressor("topk", block, k)
            want = ref.decode_values(ref.compress(g)[0])
        assert len(result) == 1 and np.array_equal(np.asarray(result[0]).reshape(-1), want), _(
            "{label}: decompress(compress(g)) after the wire differs from your functions' "
            "decode; build the payload from them and decode it with them"
        ).format(label=label)
    assert len(names) == 2, _("give the two compressors different names")
    return _("payload bytes exact, decode after the wire format")


def training_body(collect: Callable[[], tuple]) -> str:
    """A5.6's judge: ``collect()``'s two runs (float32, compressed) on 2 engines, as data."""
    result = collect()
    assert isinstance(result, tuple) and len(result) == 9, _("the training run returned no data")
    probe, reference, equal, sent, sizes, accuracy, _counters, right32, right = result
    # Error feedback is what A5.6 asks for, and block int8 alone trains this MLP well enough:
    # the probe decides it (values below one int8 step must get through over the calls).
    probe = np.asarray(probe, np.float64).reshape(-1)
    want = EF_PROBE_CALLS * EF_PROBE_SMALL
    assert probe.size and np.all(np.abs(probe - want) < 1.01 / 127), _(
        "values of {small} beside a 1.0 in their block (less than one int8 step) "
        "delivered {got} in {calls} calls "
        "instead of about {want}: wrap block int8 in your error feedback (A5.4), which "
        "carries what the cast drops into the next call"
    ).format(
        small=EF_PROBE_SMALL,
        got=f"{float(probe.max()) if probe.size else 0:.4f}",
        calls=EF_PROBE_CALLS,
        want=f"{want:.3f}",
    )
    reference, accuracy = float(np.asarray(reference)), float(np.asarray(accuracy))
    assert int(np.asarray(equal)), _(
        "the replicas differ after training: decode alike on every rank"
    )
    nbytes = sum(block_int8_bytes(int(size), A5_BLOCK) for size in np.asarray(sizes).reshape(-1))
    sent = sorted(int(s) for s in np.asarray(sent).reshape(-1))
    assert sent == [nbytes], _(
        "each step sent {sent} bytes before coding; block int8 with blocks of "
        "{block} sends {want} for the digits MLP"
    ).format(sent=sent, block=A5_BLOCK, want=nbytes)
    loss, se = accuracy_loss(right32, right)
    assert loss - A5_Z * se <= A5_ACCURACY_SLACK, _(
        "test accuracy {accuracy} % after {epochs} epoch, float32 reached "
        "{reference} % in the same steps: {loss} points lost on the same "
        "{images} images, more than {slack} point beyond their "
        "noise ({z} x its standard error {se})"
    ).format(
        accuracy=f"{accuracy:.1f}",
        epochs=A5_CONFIG.num_epochs,
        reference=f"{reference:.1f}",
        loss=f"{loss:.1f}",
        images=np.asarray(right).size,
        slack=f"{A5_ACCURACY_SLACK:g}",
        z=f"{A5_Z:g}",
        se=f"{se:.1f}",
    )
    # The verdict line must be the same on every run: the accuracies stay out of it.
    return _("2 engines, block int8 + error feedback as accurate as float32")


def accuracy_loss(right32: np.ndarray, right: np.ndarray) -> tuple[float, float]:
    """Return the points of test accuracy lost against float32 and the loss's standard error.

    Both runs are scored on the same images, so the comparison is paired (as McNemar's test):
    only the images one run gets right and the other wrong carry the difference, ``b`` lost and
    ``c`` gained of ``n``; the loss is ``(b - c) / n`` and its standard error
    ``sqrt(b + c - (b - c)^2 / n) / n`` (in points). Two runs that agree on all but a handful of
    the 297 images are judged on those few: one seed's luck in which images those are is the
    noise, and the slack is counted beyond it.
    """
    a, b = np.asarray(right32, np.int64).reshape(-1), np.asarray(right, np.int64).reshape(-1)
    assert a.size and a.size == b.size, _("the runs' scores on the test images are missing")
    n, lost, gained = a.size, int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    se = np.sqrt(max(lost + gained - (lost - gained) ** 2 / n, 0.0)) / n
    return 100 * (lost - gained) / n, 100 * float(se)


# -- the reference answers the judges compare with (never shown to a graded kernel) ---------
def blocks(n: int, block: int) -> list[tuple[int, int]]:
    """Return the ``(start, stop)`` of every block of ``block`` values in ``n`` (the last may be short)."""
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def reference_encode(g: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(q, scales)``: per block ``m = max|g|``, ``q = int8(g / m * 127)`` in float32."""
    g = np.asarray(g, np.float32).reshape(-1)
    q = np.zeros(g.size, np.int8)
    scales = np.zeros(len(blocks(g.size, block)), np.float32)
    for b, (lo, hi) in enumerate(blocks(g.size, block)):
        scales[b] = m = np.abs(g[lo:hi]).max()
        if m > 0:  # the cast truncates toward zero, as source 000's float32 -> int8 does
            q[lo:hi] = (g[lo:hi] / m * np.float32(127)).astype(np.int8)
    return q, scales


def reference_decode(q: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Return ``q / 127 * m`` (float32), ``m`` the scale of each value's block."""
    per_value = np.repeat(np.asarray(scales, np.float32), block)[: q.size]
    return q.astype(np.float32) / np.float32(127) * per_value  # multiply: the inverse of g / m


def reference_topk(g: np.ndarray, block: int, k: int) -> np.ndarray:
    """Return the ascending indices of the ``k`` largest ``|g|`` of every block (ties: lower index)."""
    g = np.asarray(g, np.float32).reshape(-1)
    kept = [
        lo + np.sort(np.argsort(-np.abs(g[lo:hi]), kind="stable")[:k])
        for lo, hi in blocks(g.size, block)
    ]
    return np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, np.int64)


def block_int8_bytes(n: int, block: int) -> int:
    """Return the payload bytes of block int8: one byte a value, one float32 scale a block."""
    return n + 4 * len(blocks(n, block))


def block_topk_bytes(n: int, block: int, k: int) -> int:
    """Return the payload bytes of block top-k: a uint32 index and a float32 value per kept value."""
    return 8 * sum(min(k, hi - lo) for lo, hi in blocks(n, block))
