"""The judges of A7: stage 2's sharded step from point-to-point, against one process bit for bit.

The engines return data (:mod:`course_grader.assignments.a7.collect`); the judge rebuilds
every rank's inputs from the same seed and redoes the arithmetic in one process: the ring's
sums in the ring's order (chunk ``c`` starts on rank ``c + 1`` and ends on its owner, each
rank adding its own part; on 3 ranks either direction gives the same bits), divided by N
once, and ``torch.optim.Adam`` over the whole bucket (elementwise, so a shard's update is
bitwise the whole vector's on those values). Right numbers are not enough: the counters must
show a ring (this rank sends only to one neighbour and hears only from the other, N - 1
messages a pass, the exact bytes of ``chunk_bounds``' uneven chunks: (N - 1)/N of the bucket
for the reduce-scatter, not an allreduce's twice that), no built-in collective, and the
ledger must show a rank keeping the Adam state of its shard only. A wrong answer is compared
with the usual mistakes (a sum for a mean, the whole optimiser state, an allreduce, shards of
the wrong size) and the verdict names the match.

Kept whole: one reference (ring sums and Adam in one process) every judge compares with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.assignments.a7.collect import (
    ADAM_LR,
    BATCH,
    TRAIN_STEPS,
    bucket,
    flatten_into_buckets,
    global_batches,
    local_gradients,
    model_buckets,
    p2p_of,
    stage2_model,
    used_of,
)
from course_lib.comm.buffers import chunk_bounds
from course_lib.parallel.sharded.audit import exact_values_sent

__all__ = [
    "RS_SIZES",
    "a7_cases",
    "judge_rank",
    "reference_stage2",
    "ring_mean",
    "sizes_of",
]

RS_SIZES = (35, 16)  # values per bucket: neither divides by 3 (12, 12, 11 and 6, 5, 5)
STATE_SLACK = 16  # bytes a shard's state may hold besides m, v and the shard's gradient: the step


def _seed(default: int, seed: int | None) -> int:
    """The checks' own seed (``seed`` None, as in the notebook), or one from the grader's."""
    return default if seed is None else (int(seed) * 1_000_003 + default) % 2**40


def a7_cases(exercise: str, seed: int | None = None) -> list[dict]:
    """The cases of ``exercise`` the engines run (``seed`` None: the notebook's own)."""
    if exercise == "A7.4":
        return [{"kind": "stage2", "model_seed": 7, "seed": _seed(74, seed)}]
    kind = {"A7.1": "rs", "A7.2": "adam", "A7.3": "ag"}[exercise]
    sizes = RS_SIZES[:1] if exercise == "A7.2" else RS_SIZES
    return [{"kind": kind, "m": m, "seed": _seed(10 * k + 71, seed)} for k, m in enumerate(sizes)]


def sizes_of(m: int, n: int) -> list[int]:
    """The shard sizes ``chunk_bounds`` gives: the first ``m % n`` one longer."""
    return [b - a for a, b in chunk_bounds(m, n)]


def _floor_sizes(m: int, n: int) -> list[int]:
    """Shards of ``m // n`` values, the rest on the last: the usual wrong layout."""
    return [m // n] * (n - 1) + [m - (n - 1) * (m // n)]


def ring_mean(parts: list[Any], n: int, divide: bool = True) -> Any:
    """The ring's reduce-scatter of ``parts`` (one flat float32 tensor a rank) in one process.

    Chunk ``c`` is summed in the ring's order, from rank ``c + 1`` round to ``c`` itself, then
    divided by ``n`` once (``divide=False``: the sum, a usual mistake). Returns the whole
    vector of chunks, each as its owner ends with it.
    """
    import torch

    m = parts[0].numel()
    out = torch.empty(m)
    for c, (a, b) in enumerate(chunk_bounds(m, n)):
        acc = parts[(c + 1) % n][a:b].clone()
        for j in range(2, n + 1):
            acc = acc + parts[(c + j) % n][a:b]
        out[a:b] = acc / n if divide else acc
    return out


def _equal(got: Any, want: Any) -> bool:
    """Bit for bit: the same shape, dtype float32 and bytes."""
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    return (
        isinstance(got, np.ndarray)
        and got.dtype == np.float32
        and got.shape == want.shape
        and got.tobytes() == want.astype(np.float32).tobytes()
    )


def _close(got: Any, want: Any, rtol: float = 1e-5) -> bool:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype.kind != "f":
        return False
    return bool(np.abs(got - want).max(initial=0.0) <= rtol * max(np.abs(want).max(), 1e-30))


# -- the counters -----------------------------------------------------------------------------
def _builtins(used: dict, rank: int, what: str) -> str:
    if not used:
        return ""
    names = ", ".join(f"comm.{n}" for n in sorted(used))
    if what == "reduce-scatter" and "allreduce" in used:
        return (
            f"rank {rank} called comm.allreduce: an allreduce leaves every rank the whole sum, "
            "twice a reduce-scatter's bytes; reduce-scatter the bucket from sendrecv instead, so "
            "that rank r keeps only its shard"
        )
    return (
        f"rank {rank} called {names} (a built-in collective): write the {what} from "
        "point-to-point messages (comm.sendrecv, or send / recv) round the ring"
    )


def _traffic(
    p2p: dict, rank: int, n: int, values: list[int], passes: int, what: str, floor: list[int]
) -> str:
    """Return "" or how this rank's traffic differs from a ring's ``passes`` passes.

    ``values``: the values this rank must send per pass; the ring sends only to one neighbour
    and receives only from the other, ``n - 1`` messages per pass. ``floor``: what it would
    send with shards of ``m // N`` values and the rest on the last rank (a usual mistake).
    """
    right, left = (rank + 1) % n, (rank - 1) % n
    want_bytes = 4 * sum(values)
    messages = passes * (n - 1)
    sent = {q: (s[0], s[1]) for q, s in p2p.items() if s[0]}
    heard = {q for q, s in p2p.items() if s[2]}
    partners = sorted(set(sent) | heard)
    ring = (set(sent), heard) in (({right}, {left}), ({left}, {right}))
    if not ring:
        talked = ", ".join(
            f"rank {q}: {p2p[q][0]} messages / {p2p[q][1]} bytes out, {p2p[q][2]} / {p2p[q][3]} in"
            for q in partners
        )
        return (
            f"rank {rank} talked to {talked or 'nobody'}; a ring sends only to rank "
            f"{right} (rank + 1) and hears only from rank {left} (rank - 1)"
        )
    got_messages, got_bytes = next(iter(sent.values()))
    if got_bytes != want_bytes or got_messages != messages:
        head = (
            f"rank {rank} sent {got_messages} messages / {got_bytes} bytes; the {what} sends "
            f"{messages} messages of one chunk each, {want_bytes} bytes"
        )
        return f"{head} ({_why_bytes(got_bytes, want_bytes, what, 4 * sum(floor))})"
    return ""


def _why_bytes(got: int, want: int, what: str, floor: int) -> str:
    if got == floor and floor != want:
        return (
            "shards of m // N values with the rest on the last rank: cut the bucket by "
            "chunk_bounds(m, N), whose first m % N shards hold one value more"
        )
    if what.startswith("reduce-scatter") and got >= 2 * want - 64:
        return (
            "about twice: that is an allreduce's traffic; a reduce-scatter sends (N - 1)/N of "
            "the bucket and leaves each rank its shard only"
        )
    if what.startswith("stage-2") and got >= 1.4 * want:
        return (
            "more than a reduce-scatter and an allgather: an allreduce where a reduce-scatter "
            "does sends (N - 1)/N of the bucket more"
        )
    return "send one chunk of chunk_bounds(m, N) a message, each chunk once a pass"


# -- the exercises ----------------------------------------------------------------------------
def _judge_rs(case: dict, rank: int, n: int, data: Any) -> str:
    m = case["m"]
    shard, used, p2p = data
    sizes = sizes_of(m, n)
    lo, hi = chunk_bounds(m, n)[rank]
    head = f"bucket of {m} values on {n} ranks ({', '.join(map(str, sizes))})"
    if why := _builtins(used_of(used), rank, "reduce-scatter"):
        return f"{head}: {why}"
    if not isinstance(shard, np.ndarray):
        return f"{head}: rank {rank} returned no tensor; return this rank's shard of the mean"
    if shard.shape != (hi - lo,):
        if shard.shape == (m,):
            return (
                f"{head}: rank {rank} returned the whole bucket ({m} values); return only its "
                f"shard, flat[{lo}:{hi}] (chunk_bounds({m}, {n})[{rank}])"
            )
        return (
            f"{head}: rank {rank}'s shard has shape {shard.shape}, not ({hi - lo},): {m} values "
            f"do not divide by {n}, so chunk_bounds({m}, {n}) gives shards of "
            f"{', '.join(map(str, sizes))} (the first {m % n} one longer); rank {rank}'s is "
            f"flat[{lo}:{hi}]"
        )
    floor = _floor_sizes(m, n)
    if why := _traffic(
        p2p_of(p2p), rank, n, [m - sizes[rank]], 1, "reduce-scatter", [m - floor[rank]]
    ):
        return f"{head}: {why}"
    parts = [bucket(m, case["seed"], r) for r in range(n)]
    want = ring_mean(parts, n)[lo:hi]
    if _equal(shard, want):
        return ""
    if _close(shard, ring_mean(parts, n, divide=False)[lo:hi]):
        return (
            f"{head}: rank {rank}'s shard is the sum over the {n} ranks, not their mean: "
            f"divide it by N = {n} (each rank's gradient is of its own batch's mean loss)"
        )
    if _close(shard, want):
        return (
            f"{head}: rank {rank}'s shard is the mean to about 1e-7 but not bit for bit: add "
            "the chunk you receive to your own (the ring's order), and divide the sum by N once "
            "at the end (flat / N, not each part, not * (1 / N))"
        )
    return f"{head}: rank {rank}'s shard differs from the mean of the {n} ranks' buckets"


def _judge_adam(case: dict, rank: int, n: int, data: Any) -> str:
    import torch

    m, seed = case["m"], case["seed"]
    weights, held, used, p2p = data
    sizes = sizes_of(m, n)
    lo, hi = chunk_bounds(m, n)[rank]
    head = f"{m} weights on {n} ranks, {TRAIN_STEPS} steps"
    used, p2p = used_of(used), p2p_of(p2p)
    if used or any(s[0] or s[2] for s in p2p.values()):
        return (
            f"{head}: rank {rank} communicated ({sorted(used) or 'point-to-point'}); the "
            "shard's Adam update is local: it needs this rank's gradient shard only"
        )
    limit = 12 * sizes[rank] + STATE_SLACK
    if int(held) > limit:
        whole = " (the whole bucket's)" if int(held) >= 8 * m else ""
        return (
            f"{head}: the ledger counts {int(held)} bytes of optimiser state on rank {rank}"
            f"{whole}; a rank that keeps the whole optimiser state is stage 0: keep Adam's m "
            f"and v for this rank's shard only, 8 x {sizes[rank]} = {8 * sizes[rank]} bytes "
            f"(torch.optim.Adam over a parameter that views flat_params[{lo}:{hi}])"
        )

    def reference(fresh: bool) -> Any:
        whole = torch.nn.Parameter(bucket(m, seed))
        optimizer = torch.optim.Adam([whole], lr=ADAM_LR)
        for t in range(TRAIN_STEPS):
            if fresh:
                optimizer = torch.optim.Adam([whole], lr=ADAM_LR)
            whole.grad = bucket(m, seed + 1 + t)
            optimizer.step()
        return whole.detach()

    want, before = reference(False), bucket(m, seed)
    if not isinstance(weights, np.ndarray) or weights.shape != (m,):
        return f"{head}: flat_params changed shape; update its slice in place"
    outside = np.concatenate([weights[:lo], weights[hi:]])
    if not _equal(outside, torch.cat([before[:lo], before[hi:]])):
        return (
            f"{head}: rank {rank} changed weights outside its shard [{lo}:{hi}]; update only "
            "this rank's slice (the allgather brings the others)"
        )
    if _equal(weights[lo:hi], want[lo:hi]):
        return ""
    if _equal(weights[lo:hi], before[lo:hi]):
        return (
            f"{head}: rank {rank}'s shard was not updated in flat_params: the optimiser must "
            f"update a view of flat_params[{lo}:{hi}] (not a copy)"
        )
    if _close(weights[lo:hi], reference(True)[lo:hi]):
        return (
            f"{head}: rank {rank}'s updates are each a first Adam step: keep the optimiser "
            "(m, v and the step count) in `state` between calls instead of making a new one"
        )
    if _close(weights[lo:hi], want[lo:hi]):
        return (
            f"{head}: rank {rank}'s shard is within 1e-5 of one process's Adam but not bit for "
            "bit: use torch.optim.Adam over the shard, which updates it exactly as one process"
        )
    return f"{head}: rank {rank}'s shard differs from torch.optim.Adam's in one process"


def _judge_ag(case: dict, rank: int, n: int, data: Any) -> str:
    m, seed = case["m"], case["seed"]
    flat, returned, used, p2p = data
    sizes = sizes_of(m, n)
    head = f"bucket of {m} values on {n} ranks ({', '.join(map(str, sizes))})"
    if why := _builtins(used_of(used), rank, "allgather"):
        return f"{head}: {why}"
    want = bucket(m, seed)
    if not _equal(flat, want):
        if _equal(returned, want):
            return (
                f"{head}: rank {rank}'s gathered weights are in the tensor you returned, not in "
                "flat: fill flat in place (the model's parameters are views of it)"
            )
        stale = [
            c
            for c, (a, b) in enumerate(chunk_bounds(m, n))
            if isinstance(flat, np.ndarray)
            and flat.shape == (m,)
            and not _equal(flat[a:b], want[a:b])
        ]
        if stale:
            return (
                f"{head}: on rank {rank} the shards of ranks {stale} are not the owners' "
                "(send this rank's shard on, and store each chunk received where it belongs)"
            )
        return f"{head}: rank {rank}'s flat is not every owner's shard"
    floor = _floor_sizes(m, n)[(rank + 1) % n]
    why = _traffic(p2p_of(p2p), rank, n, [m - sizes[(rank + 1) % n]], 1, "allgather", [m - floor])
    return f"{head}: {why}" if why else ""


def reference_stage2(case: dict, n: int, divide: bool = True) -> list[Any]:
    """A7.4 in one process: every rank's gradients, the ring's mean, Adam over each bucket."""
    import torch

    model = stage2_model(case["model_seed"])
    flats = flatten_into_buckets(model)
    whole = [torch.nn.Parameter(f) for f in flats]  # views: the model sees the updates
    optimizers = [torch.optim.Adam([w], lr=ADAM_LR) for w in whole]
    per = BATCH // n
    for X, y in global_batches(case["seed"]):
        grads = [local_gradients(model, X[r * per : (r + 1) * per], y[r * per : (r + 1) * per])
                 for r in range(n)]  # fmt: skip
        for b, (w, optimizer) in enumerate(zip(whole, optimizers, strict=True)):
            w.grad = ring_mean([g[b] for g in grads], n, divide)
            optimizer.step()
    return [f.detach().clone() for f in flats]


def _judge_stage2(case: dict, rank: int, n: int, data: Any) -> str:
    flats, held, used, p2p = data
    model = stage2_model(case["model_seed"])
    ms = [sum(p.numel() for p in params) for params in model_buckets(model)]
    head = f"{TRAIN_STEPS} steps, buckets of {ms[0]} and {ms[1]} values on {n} ranks"
    if why := _builtins(used_of(used), rank, "reduce-scatter and allgather"):
        return f"{head}: {why}"
    values = [exact_values_sent(2, ms, rank, n)]  # the kit's bytes auditor (lecture 11)
    floor = []
    for m in ms:
        layout = _floor_sizes(m, n)
        floor += [m - layout[rank], m - layout[(rank + 1) % n]]
    what = "stage-2 step (a reduce-scatter and an allgather per bucket and step)"
    passes = 2 * len(ms) * TRAIN_STEPS
    steps = TRAIN_STEPS
    sent = sum(s[0] for s in p2p_of(p2p).values())
    if sent == passes * (n - 1) // 2:
        return (
            f"{head}: rank {rank} sent {sent} messages, one pass a bucket and step: after the "
            "shard's update every rank needs the whole updated weights (allgather them), and "
            "before it the shard of the mean gradient (reduce-scatter)"
        )
    if why := _traffic(p2p_of(p2p), rank, n, values * steps, passes, what, floor * steps):
        return f"{head}: {why}"
    held = [int(h) for h in held]
    for m, h in zip(ms, held, strict=True):
        shard = sizes_of(m, n)[rank]
        if h > 12 * shard + STATE_SLACK:
            return (
                f"{head}: the ledger counts {h} bytes of optimiser state for the bucket of {m} "
                f"values on rank {rank}: a rank that keeps the whole optimiser state "
                f"({8 * m} bytes for Adam's m and v) is not stage 2; keep them for its shard of "
                f"{shard} values only ({8 * shard} bytes)"
            )
    want = reference_stage2(case, n)
    if not isinstance(flats, (list, tuple)) or len(flats) != len(ms):
        return f"{head}: rank {rank} returned no weights"
    if all(_equal(g, w) for g, w in zip(flats, want, strict=True)):
        return ""
    summed = reference_stage2(case, n, divide=False)
    if all(_equal(g, w) for g, w in zip(flats, summed, strict=True)):
        return (
            f"{head}: rank {rank}'s weights are those of Adam on the sum of the {n} ranks' "
            f"gradients, not their mean: divide the reduced shard by N = {n} (Adam hides most "
            "of the factor, not all of it)"
        )
    if all(_close(g, w) for g, w in zip(flats, want, strict=True)):
        return (
            f"{head}: rank {rank}'s weights are within 1e-5 of one process but not bit for "
            "bit: reduce in the ring's order, divide the sum by N once, and update with "
            "torch.optim.Adam over the shard"
        )
    return (
        f"{head}: rank {rank}'s weights differ from one process trained with torch.optim.Adam "
        "on the mean gradient (reduce-scatter, the shard's Adam, allgather: every bucket, every "
        "step)"
    )


def judge_rank(exercise: str, case: dict, rank: int, n: int, data: Any) -> str:
    """Return "" or what is wrong with rank ``rank``'s data for one case of ``exercise``."""
    expect = {"rs": 3, "adam": 4, "ag": 4, "stage2": 4}[case["kind"]]
    if not isinstance(data, (list, tuple)) or len(data) != expect:
        return f"rank {rank} returned no result"
    judge = {"rs": _judge_rs, "adam": _judge_adam, "ag": _judge_ag, "stage2": _judge_stage2}
    return judge[case["kind"]](case, rank, n, data)
