"""What A5's checks of the exchange collect from the answer: the calls, returning data only.

The notebook's check cells call these functions in the kernel and judge what they return with
:mod:`course_grader.assignments.a5.exchange`; the grader ships this module's *source* into
the graded kernel (where ``course_lib.checks`` is hidden) and judges the same data in its own
process. So this module imports nothing from ``course_lib.checks`` and returns arrays, numbers and
strings, never the answer's objects. The inner compressors that A5.4 wraps are the block formats;
the judges in :mod:`course_grader.assignments.a5.exchange` compare with these same compressors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload
from course_lib.i18n import _

__all__ = [
    "A5_BLOCK",
    "A5_CONFIG",
    "EF_PROBE_CALLS",
    "EF_PROBE_SMALL",
    "carried_over",
    "collect_compressor",
    "collect_error_feedback",
    "collect_training",
    "inner_compressor",
]


def _config() -> Any:
    from course_lib.training.loop import TrainConfig

    return TrainConfig(num_epochs=1, batch_size=32, lr=0.1, momentum=0.9, seed=1)


A5_CONFIG = _config()  # digits MLP, 1 epoch of global batch 32 (46 steps on 2 ranks)
A5_BLOCK = 64  # A5.6's block size
EF_PROBE_SMALL = 0.003  # below one step 1/127 of a block whose largest value is 1.0
EF_PROBE_CALLS = 8  # the small values pass that step every third call with error feedback


class _InnerBlockInt8(Compressor):
    """Block int8 max-abs: what A5.4's error feedback wraps first."""

    name = "ref_block_int8"

    def __init__(self, block: int) -> None:
        self.block = block

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        g = np.asarray(tensor, np.float32).reshape(-1)
        q, scales = np.zeros(g.size, np.int8), []
        for lo in range(0, g.size, self.block):
            m = np.abs(g[lo : lo + self.block]).max()
            scales.append(m)
            if m > 0:
                q[lo : lo + self.block] = (g[lo : lo + self.block] / m * np.float32(127)).astype(
                    np.int8
                )
        parts = {"q": q, "scales": np.asarray(scales, np.float32)}
        return Payload(self.name, (g.size,), "float32", parts), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        q, scales = payload.parts["q"], payload.parts["scales"]
        return q.astype(np.float32) / np.float32(127) * np.repeat(scales, self.block)[: q.size]


class _InnerBlockTopK(Compressor):
    """Block top-k: what A5.4's error feedback wraps second."""

    name = "ref_block_topk"

    def __init__(self, block: int, k: int) -> None:
        self.block, self.k = block, k

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        g = np.asarray(tensor, np.float32).reshape(-1)
        kept = [
            lo + np.sort(np.argsort(-np.abs(g[lo : lo + self.block]), kind="stable")[: self.k])
            for lo in range(0, g.size, self.block)
        ]
        idx = np.concatenate(kept).astype(np.int64)
        parts = {"indices": idx.astype(np.uint32), "values": g[idx]}
        return Payload(self.name, (g.size,), "float32", parts), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        out = np.zeros(payload.numel, np.float32)
        out[payload.parts["indices"]] = payload.parts["values"]
        return out


def inner_compressor(kind: str, block: int, k: int = 0) -> Compressor:
    """Return the block int8 (``kind="int8"``) or block top-k compressor A5.4 wraps."""
    return _InnerBlockInt8(block) if kind == "int8" else _InnerBlockTopK(block, k)


def collect_error_feedback(wrapper: Callable, case: dict) -> list[np.ndarray]:
    """A5.4: wrap the case's inner compressor; return what each call sent, decoded (float32)."""
    inner = inner_compressor(case["kind"], int(case["block"]), int(case["k"]))
    ef = wrapper(inner)
    sent = []
    for name, g in zip(case["names"], case["gradients"], strict=True):
        result = ef.compress(np.array(g, np.float32), name)
        assert isinstance(result, tuple) and len(result) == 2, _(
            "compress must return (payload, ctx), as the inner compressor does"
        )
        sent.append(np.asarray(inner.decode_values(result[0]), np.float32))
    return sent


def collect_compressor(comp: Any, g: np.ndarray, stage: str) -> tuple:
    """A5.5: ``stage`` "payload": (class name, payload bytes, payload kind); "wire": the values
    ``comp`` decompresses from its payload after the wire format (the bytes are judged first)."""
    from course_lib.compression.wire import pack, unpack

    label = type(comp).__name__
    assert isinstance(comp, Compressor), _("{label} must subclass Compressor").format(label=label)
    payload, _ctx = comp.compress(np.array(g, np.float32), "fc1.weight")
    assert isinstance(payload, Payload), _("{label}.compress must return (Payload, ctx)").format(
        label=label
    )
    if stage == "payload":
        return label, int(payload.nbytes), str(payload.kind)
    received, _ctx = unpack(pack(payload))  # what another rank gets over the wire
    return (np.asarray(comp.decompress(received)).reshape(-1),)


def _train(cluster: Any, method: str, **options: Any) -> Any:
    from course_lib.data.digits import load_digits
    from course_lib.parallel.data_parallel.train import train_data_parallel

    return train_data_parallel(
        cluster,
        model="mlp",
        dataset=load_digits,
        config=A5_CONFIG,
        method=method,
        world_size=2,
        test_set=load_digits(train=False),
        comm_timeout=30,
        timeout=300,
        **options,
    )


def carried_over(comp: Any, calls: int = EF_PROBE_CALLS) -> np.ndarray:
    """A5.6's error-feedback probe: what ``comp`` delivers of values below one int8 step.

    Every block of the probe gradient holds one value 1.0 and values of ``EF_PROBE_SMALL``, less
    than a step 1/127 of the block's scale, so block int8 alone truncates them to 0 on every
    call; with error feedback they build up in the residual and go out every few calls. Returns
    the decoded small values summed over ``calls`` calls of the same gradient (error feedback:
    within one step of ``calls * EF_PROBE_SMALL``; none: 0).
    """
    from course_lib.compression.wire import pack, unpack

    g = np.full(4 * A5_BLOCK, EF_PROBE_SMALL, np.float32)
    g[::A5_BLOCK] = 1.0
    small = np.ones(g.size, bool)
    small[::A5_BLOCK] = False
    total = np.zeros(int(small.sum()), np.float32)
    for _call in range(calls):
        payload, _ctx = comp.compress(g.copy(), "probe.weight")
        received, _ctx = unpack(pack(payload))  # what another rank decodes
        total += np.asarray(comp.decompress(received), np.float32).reshape(-1)[small]
    return total


def _correct(result: Any) -> np.ndarray:
    """Which test images a run's final weights classify right (int8 0/1, one per image)."""
    import torch

    from course_lib.data.digits import load_digits
    from course_lib.training.models import build_model

    model = build_model("mlp")
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in result.weights.items()})
    X, y = load_digits(train=False).tensors
    with torch.no_grad():
        return (model(X).argmax(1) == y).numpy().astype(np.int8)


def collect_training(make: Callable, cluster: Any) -> tuple:
    """A5.6: probe ``make()`` for error feedback, then train with float32 and with ``make()``.

    Returns (the probe's carried-over values, float32 test accuracy %, replicas equal 0/1, the
    distinct bytes sent per step before coding, the sizes of the weights, the compressed run's
    test accuracy %, the two runs' counters: ``DataParallelResult.counters`` each, then which
    test images each run's weights classify right: float32's, the compressed run's). Without
    anything carried over, the runs are skipped (NaN): the verdict is decided by the probe.
    """
    assert cluster.world_size >= 2, _("the check needs 2 engines: start_cluster(n=2)")
    comp = make()  # a stub fails here, before any engine is busy
    assert isinstance(comp, Compressor), _(
        "a5_compressor() returned {comp}, not a Compressor"
    ).format(comp=repr(comp))
    probe = carried_over(make())  # a fresh object: the training run starts with no residual
    if not np.any(probe):
        none = np.zeros(0, np.int64)
        return probe, float("nan"), 0, none, none, float("nan"), [], none, none
    float32 = _train(cluster, "ring")
    reference = float32.history.last["test_accuracy"] * 100
    result = _train(
        cluster, "compressed", compressor=comp, carrier="allgather", granularity="tensor"
    )
    sizes = np.array([int(w.size) for w in result.weights.values()], np.int64)
    sent = np.array(sorted({int(r["bytes_compressed"]) for r in result.records}), np.int64)
    accuracy = result.history.last["test_accuracy"] * 100
    equal = int(bool(result.replicas_equal))
    runs = [float32.counters, result.counters]
    right = (_correct(float32), _correct(result))
    return probe, float(reference), equal, sent, sizes, float(accuracy), runs, *right
