"""The judges of A7: ZeRO stage 2's gradient hooks and the shard's update, against one process.

The engines return data (:mod:`course_grader.assignments.a7.collect`); the judge rebuilds
every rank's inputs from the same seed and redoes the arithmetic in one process.

A7.1: after each backward pass, every bucket's shard must be this rank's chunk
(``chunk_bounds``) of the ranks' mean gradient (to float32's rounding: the built-in
reduce-scatter sums in its own order). Right numbers are not enough: the memory ledger, sampled
at every parameter's gradient, must show stage 2's profile: while bucket ``b``'s gradients are
produced no full-size gradient of an earlier bucket is held (each was reduce-scattered and
freed), none is left at the end of backward, the shards dict holds shards only, and bucket
``b - 1`` was reduced before bucket ``b``'s first gradient. An answer that keeps every full
gradient until the end of backward has the right shards and stage 1's memory: it fails, named.

A7.2: the shard's Adam update and the allgather, against ``torch.optim.Adam`` over the whole
bucket in one process (Adam is elementwise), every rank holding every updated value; the
ledger must show Adam's state for the shard only. A wrong answer is compared with the usual
mistakes (a sum for a mean, the whole bucket kept, the whole optimiser state, a fresh
optimiser each step, no gather, an allreduce to gather) and the verdict names the match.

Kept whole: one judge per exercise, each a list of named mistakes; most lines are their messages
(``_()`` templates and their fields, read in the student's language).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.assignments.a7.collect import (
    ADAM_LR,
    BACKWARDS,
    TRAIN_STEPS,
    bucket,
    hook_model,
    model_buckets,
    rank_batch,
    used_of,
)
from course_lib.comm.buffers import chunk_bounds
from course_lib.i18n import _

__all__ = ["UPDATE_SIZES", "a7_cases", "judge_rank", "mean_gradients", "sizes_of"]

UPDATE_SIZES = (35, 16)  # values per bucket: neither divides by 3 (12, 12, 11 and 6, 5, 5)
STATE_SLACK = 16  # bytes a shard's state may hold besides m, v and the shard's weights: the step
SHARDS_SLACK = 64  # bytes the shards dict may hold besides the shards (a counter tensor or two)


def _seed(default: int, seed: int | None) -> int:
    """The checks' own seed (``seed`` None, as in the notebook), or one from the grader's."""
    return default if seed is None else (int(seed) * 1_000_003 + default) % 2**40


def a7_cases(exercise: str, seed: int | None = None) -> list[dict]:
    """The cases of ``exercise`` the engines run (``seed`` None: the notebook's own)."""
    if exercise == "A7.1":
        return [{"kind": "hooks", "model_seed": 7, "seed": _seed(71, seed)}]
    return [
        {"kind": "update", "m": m, "seed": _seed(10 * k + 72, seed)}
        for k, m in enumerate(UPDATE_SIZES)
    ]


def sizes_of(m: int, n: int) -> list[int]:
    """The shard sizes ``chunk_bounds`` gives: the first ``m % n`` one longer."""
    return [b - a for a, b in chunk_bounds(m, n)]


def _close(got: Any, want: Any, rtol: float = 1e-5) -> bool:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype.kind != "f":
        return False
    return bool(np.abs(got - want).max(initial=0.0) <= rtol * max(np.abs(want).max(), 1e-30))


def mean_gradients(case: dict, n: int, step: int) -> tuple[list[Any], list[list[Any]]]:
    """Backward pass ``step`` of A7.1 in one process: every bucket's mean over the ``n`` ranks
    (float64, then float32), and every rank's own flat gradients per bucket."""
    import torch
    import torch.nn.functional as F

    model = hook_model(case["model_seed"])
    own = []
    for r in range(n):
        X, y = rank_batch(case["seed"], step, r)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(X), y).backward()
        own.append([torch.cat([p.grad.reshape(-1) for p in ps]) for ps in model_buckets(model)])
    means = [
        (sum(g[b].double() for g in own) / n).float() for b in range(len(model_buckets(model)))
    ]
    return means, own


# -- A7.1: the hooks --------------------------------------------------------------------------
def _collectives(used: dict, rank: int) -> str:
    other = sorted(set(used) - {"reduce_scatter"})
    if not other:
        return ""
    if "allreduce" in other:
        return _(
            "rank {rank} called comm.allreduce: an allreduce leaves every rank the whole "
            "bucket's sum, a full-size gradient again; stage 2 reduce-scatters, and each rank "
            "keeps its shard only"
        ).format(rank=rank)
    names = ", ".join(f"comm.{n}" for n in other)
    return _("rank {rank} called {names}: the gradients need a reduce-scatter only").format(
        rank=rank, names=names
    )


def _shards(case: dict, rank: int, n: int, got: Any) -> str:
    """Return "" or what is wrong with the shards the hooks stored, pass after pass."""
    sizes = [sum(p.numel() for p in ps) for ps in model_buckets(hook_model(case["model_seed"]))]
    if not isinstance(got, (list, tuple)) or len(got) != BACKWARDS:
        return _("rank {rank} returned no shards").format(rank=rank)
    for step, stored in enumerate(got):
        means, own = mean_gradients(case, n, step)
        for b, (m, shard) in enumerate(zip(sizes, stored, strict=True)):
            lo, hi = chunk_bounds(m, n)[rank]
            where = (
                _("after the first backward pass, shards[{b}] (bucket {b}, {m} values)")
                if step == 0
                else _("after a second backward pass, shards[{b}] (bucket {b}, {m} values)")
            ).format(b=b, m=m)
            if shard is None:
                if step > 0 and all(s is not None for s in got[0]):
                    return _(
                        "{where} was missing on rank {rank}, though the first pass stored it: "
                        "the hooks fire again in every backward pass, and a bucket is complete "
                        "once each of its parameters' gradients has arrived in this pass"
                    ).format(where=where, rank=rank)
                return _(
                    "{where} was missing on rank {rank}: store this rank's shard of every "
                    "bucket's mean gradient in shards, keyed by the bucket's index (0 for the "
                    "bucket backward produces first)"
                ).format(where=where, rank=rank)
            if shard.shape == (m,):
                return _(
                    "{where} holds the whole bucket on rank {rank}: stage 2 keeps this rank's "
                    "shard only, chunk_bounds({m}, {n})[{rank}] = [{lo}:{hi}] ({size} values)"
                ).format(where=where, rank=rank, m=m, n=n, lo=lo, hi=hi, size=hi - lo)
            if shard.shape != (hi - lo,):
                return _(
                    "{where} has shape {shape} on rank {rank}, not ({size},): this "
                    "rank's shard is chunk_bounds({m}, {n})[{rank}] = [{lo}:{hi}]"
                ).format(
                    where=where, shape=shard.shape, rank=rank, size=hi - lo, m=m, n=n, lo=lo, hi=hi
                )
            if _close(shard, means[b][lo:hi]):
                continue
            if _close(shard, n * means[b][lo:hi]):
                return _(
                    "{where} on rank {rank} is the sum over the {n} ranks, not their mean: "
                    "divide it by N = {n} (each rank's gradient is of its own batch's mean loss)"
                ).format(where=where, rank=rank, n=n)
            if _close(shard, own[rank][b][lo:hi]):
                return _(
                    "{where} on rank {rank} is this rank's own gradient: reduce it over the "
                    "{n} ranks"
                ).format(where=where, rank=rank, n=n)
            return _(
                "{where} on rank {rank} differs from the mean of the {n} ranks' gradients"
            ).format(where=where, rank=rank, n=n)
    return ""


def _memory(case: dict, rank: int, rows: Any) -> str:
    """Return "" or how the ledger, sampled during backward, differs from stage 2's."""
    buckets = model_buckets(hook_model(case["model_seed"]))
    sizes = [sum(p.numel() for p in ps) for ps in buckets]
    nb, total = len(sizes), 4 * sum(sizes)
    rows = np.asarray(rows, np.int64).reshape(-1, nb + 4)
    if len(rows) != BACKWARDS * (sum(len(ps) for ps in buckets) + 1):
        return _("rank {rank}'s memory ledger has {samples} samples: the hooks did not run").format(
            rank=rank, samples=len(rows)
        )
    peak = int(rows[:, 2 : 2 + nb].sum(axis=1).max())
    stage2 = max(4 * m for m in sizes)
    for step, b, *rest in rows.tolist():
        held, calls = rest[:nb], rest[nb + 1]
        kept = [c for c in range(nb) if held[c] and (c < b or b == nb)]
        if kept:
            c = kept[0]
            when = (
                _("at the end of backward")
                if b == nb
                else _("when bucket {b}'s were produced").format(b=b)
            )
            late = rows[(rows[:, 0] == step) & (rows[:, 1] >= nb - 1)]  # the last bucket's
            to_the_end = bool(late[:, 2 + c].sum())
            name = (
                _("every full gradient kept until the end of backward, stage 1's memory")
                if to_the_end
                else _("full gradients kept after their bucket was complete")
            )
            return _(
                "the shards are right, but rank {rank}'s memory ledger still held bucket {c}'s "
                "full-size gradients ({held} bytes) {when}: {name} (a peak of {peak} bytes "
                "of full-size gradients, {total} for all {nb} buckets); stage 2 frees each "
                "bucket's full gradients as soon as it is reduce-scattered, so at most one "
                "bucket's are held ({stage2} bytes here)"
            ).format(
                rank=rank,
                c=c,
                held=held[c],
                when=when,
                name=name,
                peak=peak,
                total=total,
                nb=nb,
                stage2=stage2,
            )
        if b < nb and calls < b:
            return _(
                "the shards are right, but on rank {rank} bucket {prev} had not been reduced "
                "when bucket {b}'s gradients were produced ({calls} collectives so far): the "
                "reduce-scatter of a bucket runs during backward, as soon as the bucket is "
                "complete, not after backward"
            ).format(rank=rank, prev=b - 1, b=b, calls=calls)
    return ""


def _shard_bytes(case: dict, rank: int, n: int, rows: Any) -> str:
    sizes = [sum(p.numel() for p in ps) for ps in model_buckets(hook_model(case["model_seed"]))]
    nb = len(sizes)
    rows = np.asarray(rows, np.int64).reshape(-1, nb + 4)
    held = int(rows[:, 2 + nb].max())
    want = 4 * sum(sizes_of(m, n)[rank] for m in sizes)
    if held > want + SHARDS_SLACK:
        return _(
            "the shards are right, but on rank {rank} the shards dict holds {held} bytes where "
            "its shards are {want}: a tensor that views a bigger buffer keeps the whole "
            "buffer alive (a full-size gradient in all but name)"
        ).format(rank=rank, held=held, want=want)
    return ""


def _judge_hooks(case: dict, rank: int, n: int, data: Any) -> str:
    got, rows, used, _p2p = data
    head = _("3 buckets (12, 40, 35 values) on {n} ranks, {backwards} backward passes").format(
        n=n, backwards=BACKWARDS
    )
    for why in (
        _collectives(used_of(used), rank),
        _shards(case, rank, n, got),
        _memory(case, rank, rows),
        _shard_bytes(case, rank, n, rows),
    ):
        if why:
            return f"{head}: {why}"
    return ""


# -- A7.2: the shard's update and the allgather ----------------------------------------------
def _adam(m: int, seed: int, fresh: bool = False) -> Any:
    import torch

    whole = torch.nn.Parameter(bucket(m, seed))
    optimizer = torch.optim.Adam([whole], lr=ADAM_LR)
    for t in range(TRAIN_STEPS):
        if fresh:
            optimizer = torch.optim.Adam([whole], lr=ADAM_LR)
        whole.grad = bucket(m, seed + 1 + t)
        optimizer.step()
    return whole.detach()


def _judge_update(case: dict, rank: int, n: int, data: Any) -> str:
    m, seed = case["m"], case["seed"]
    weights, held, used, _p2p = data
    sizes = sizes_of(m, n)
    lo, hi = chunk_bounds(m, n)[rank]
    head = _("a bucket of {m} values on {n} ranks ({sizes}), {steps} steps").format(
        m=m, n=n, sizes=", ".join(map(str, sizes)), steps=TRAIN_STEPS
    )
    used = used_of(used)
    if "allreduce" in used:
        return _(
            "{head}: rank {rank} called comm.allreduce: an allreduce that gathers sends twice "
            "an allgather's bytes ((N - 1)/N of the bucket each way round the ring); gather "
            "the shards with an allgather"
        ).format(head=head, rank=rank)
    limit = 12 * sizes[rank] + STATE_SLACK
    if int(held) > limit:
        whole = _(" (the whole bucket's)") if int(held) >= 8 * m else ""
        return _(
            "{head}: the ledger counts {held} bytes of optimiser state on rank {rank}"
            "{whole}; a rank that keeps the whole optimiser state is not stage 2: Adam's m and "
            "v for this rank's shard of {size} values are {nbytes} bytes"
        ).format(
            head=head,
            held=int(held),
            rank=rank,
            whole=whole,
            size=sizes[rank],
            nbytes=8 * sizes[rank],
        )
    if not isinstance(weights, np.ndarray) or weights.shape != (m,):
        return _("{head}: flat_params changed shape on rank {rank}; update it in place").format(
            head=head, rank=rank
        )
    want, before = _adam(m, seed).numpy(), bucket(m, seed).numpy()
    if _close(weights, want, 1e-6):
        return ""
    mine = _close(weights[lo:hi], want[lo:hi], 1e-6)
    if mine:
        stale = [q for q, (a, b) in enumerate(chunk_bounds(m, n))
                 if q != rank and np.array_equal(weights[a:b], before[a:b])]  # fmt: skip
        if stale:
            return _(
                "{head}: on rank {rank} the shards of ranks {stale} are the weights before the "
                "step: after its own shard's update every rank needs every owner's updated "
                "shard (an allgather)"
            ).format(head=head, rank=rank, stale=stale)
        return _(
            "{head}: on rank {rank} the other ranks' shards are not their owners' updates"
        ).format(head=head, rank=rank)
    if np.array_equal(weights[lo:hi], before[lo:hi]):
        return _(
            "{head}: rank {rank}'s own shard [{lo}:{hi}] was not updated in flat_params: the "
            "update must land in flat_params itself"
        ).format(head=head, rank=rank, lo=lo, hi=hi)
    if _close(weights[lo:hi], _adam(m, seed, fresh=True).numpy()[lo:hi], 1e-6):
        return _(
            "{head}: rank {rank}'s updates are each a first Adam step: Adam's m, v and step "
            "count must last from one call to the next (in state)"
        ).format(head=head, rank=rank)
    return _("{head}: rank {rank}'s shard differs from torch.optim.Adam's in one process").format(
        head=head, rank=rank
    )


def judge_rank(exercise: str, case: dict, rank: int, n: int, data: Any) -> str:
    """Return "" or what is wrong with rank ``rank``'s data for one case of ``exercise``."""
    if not isinstance(data, (list, tuple)) or len(data) != 4:
        return _("rank {rank} returned no result").format(rank=rank)
    judge = {"hooks": _judge_hooks, "update": _judge_update}[case["kind"]]
    return judge(case, rank, n, data)
