"""The exchange's part of assignment A5's checks: error feedback, compressor objects, training.

A5.4 checks error feedback step by step and by its running sum (what is not sent now is sent
later) around the reference compressors of :mod:`course_lib.checks.assignments.a5_reference`; A5.5 sends the
student's compressor objects' payloads through the wire format; A5.6 trains on real engines
through the kit's compressed exchange, which must reach the float32 run's test accuracy (within
:data:`A5_ACCURACY_SLACK`) in the same steps. The functions here return the verdict's detail or
raise :class:`AssertionError` with what is wrong; :mod:`course_lib.checks.assignments.a5` turns them into
verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.assignments.a5_reference import (
    ReferenceBlockInt8,
    ReferenceBlockTopK,
    block_int8_bytes,
    block_topk_bytes,
    reference_decode,
    reference_encode,
)
from course_lib.compression.base import Compressor, Payload

__all__ = [
    "A5_ACCURACY_SLACK",
    "A5_BLOCK",
    "A5_CONFIG",
    "compressors_body",
    "error_feedback_body",
    "training_body",
]

A5_BLOCK = 64  # the training run's block size
#: test-accuracy points block int8 + error feedback may lose against float32 in the same steps
A5_ACCURACY_SLACK = 1.0


def _config() -> Any:
    from course_lib.training.loop import TrainConfig

    return TrainConfig(num_epochs=1, batch_size=32, lr=0.1, momentum=0.9, seed=1)


A5_CONFIG = _config()  # digits MLP, 1 epoch of global batch 32 (46 steps on 2 ranks)


def error_feedback_body(wrapper: Callable) -> str:
    """A5.4's body: ``wrapper(inner)`` sends compress(g + residual), one residual per name."""
    rng = np.random.default_rng(504)
    steps = 30
    for inner, label in (
        (ReferenceBlockInt8(8), "block int8"),
        (ReferenceBlockTopK(16, 2), "block top-2"),
    ):
        ef = wrapper(inner)
        names = {"fc1.weight": 48, "fc1.bias": 16}
        residual = {n: np.zeros(size, np.float32) for n, size in names.items()}
        total_g = {n: np.zeros(size) for n, size in names.items()}
        total_sent = {n: np.zeros(size) for n, size in names.items()}
        for step in range(1, steps + 1):
            for name, size in names.items():  # two tensors, interleaved: one memory per name
                g = (rng.standard_normal(size) * (1 + step % 3)).astype(np.float32)
                corrected = g + residual[name]
                want = inner.decode_values(inner.compress(corrected, name)[0])
                residual[name] = corrected - want
                result = ef.compress(g.copy(), name)
                assert isinstance(result, tuple) and len(result) == 2, (
                    "compress must return (payload, ctx), as the inner compressor does"
                )
                sent = np.asarray(inner.decode_values(result[0]), np.float32)
                total_g[name] += g
                total_sent[name] += sent
                if np.array_equal(sent, want):
                    continue
                if step == 1:
                    raise AssertionError(
                        f"{label}, {name!r}, step 1: the payload is not compress(g) (no residual "
                        "yet): compress g + residual with the inner compressor"
                    )
                gap = float(np.abs(total_g[name] - total_sent[name]).max())
                held = float(np.abs(residual[name]).max())
                raise AssertionError(
                    f"{label}, {name!r}, step {step}: the payload is not compress(g + residual). "
                    f"After {step} steps sum(g) - sum(sent) should be the residual (at most "
                    f"{held:.3g} here), it is {gap:.3g}: keep residual = (g + residual) - sent, "
                    "one per tensor name, in float32"
                )
    return f"block int8 and block top-2, 2 tensors, {steps} steps: sent + residual = sum of g"


def compressors_body(int8_cls: Callable, topk_cls: Callable) -> str:
    """A5.5's body: the compressors' payloads have the exact bytes and decode after the wire."""
    from course_lib.compression.wire import pack, unpack

    rng = np.random.default_rng(550)
    g = (rng.standard_normal(300) ** 3).astype(np.float32)
    block, k = 32, 3
    cases = [
        (
            int8_cls(block),
            reference_decode(*reference_encode(g, block), block),
            block_int8_bytes(g.size, block),
            "int8 + one float32 scale per block",
        ),
        (
            topk_cls(block, k),
            ReferenceBlockTopK(block, k).decode_values(ReferenceBlockTopK(block, k).compress(g)[0]),
            block_topk_bytes(g.size, block, k),
            "a uint32 index and a float32 value per kept value",
        ),
    ]
    names = set()
    for comp, want, nbytes, layout in cases:
        label = type(comp).__name__
        assert isinstance(comp, Compressor), f"{label} must subclass Compressor"
        payload, _ = comp.compress(g.copy(), "fc1.weight")
        assert isinstance(payload, Payload), f"{label}.compress must return (Payload, ctx)"
        assert payload.nbytes == nbytes, (
            f"{label} sends {payload.nbytes} bytes for {g.size} values in blocks of {block}, "
            f"expected {nbytes}: {layout}"
        )
        received, _ = unpack(pack(payload))  # what another rank gets over the wire
        got = np.asarray(comp.decompress(received)).reshape(-1)
        assert np.array_equal(got, want), (
            f"{label}: decompress(compress(g)) after the wire differs from your functions' "
            "decode; build the payload from them and decode it with them"
        )
        names.add(payload.kind)
    assert len(names) == 2, "give the two compressors different names"
    return "payload bytes exact, decode after the wire format"


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


def training_body(make: Callable, cluster: Any) -> str:
    """A5.6's body: ``make()`` trains the digits MLP on 2 engines as accurately as float32."""
    assert cluster.world_size >= 2, "the check needs 2 engines: start_cluster(n=2)"
    comp = make()  # a stub fails here, before any engine is busy
    assert isinstance(comp, Compressor), f"a5_compressor() returned {comp!r}, not a Compressor"
    reference = _train(cluster, "ring").history.last["test_accuracy"] * 100
    result = _train(
        cluster, "compressed", compressor=comp, carrier="allgather", granularity="tensor"
    )
    assert result.replicas_equal, "the replicas differ after training: decode alike on every rank"
    nbytes = sum(block_int8_bytes(int(w.size), A5_BLOCK) for w in result.weights.values())
    sent = {int(r["bytes_compressed"]) for r in result.records}
    assert sent == {nbytes}, (
        f"each step sent {sorted(sent)} bytes before coding; block int8 with blocks of "
        f"{A5_BLOCK} sends {nbytes} for the digits MLP"
    )
    accuracy = result.history.last["test_accuracy"] * 100
    assert accuracy >= reference - A5_ACCURACY_SLACK, (
        f"test accuracy {accuracy:.1f} % after {A5_CONFIG.num_epochs} epoch, float32 reached "
        f"{reference:.1f} % in the same steps (at most {A5_ACCURACY_SLACK:g} point less)"
    )
    # The verdict line must be the same on every run: the accuracies stay out of it.
    return "2 engines, block int8 + error feedback as accurate as float32"
