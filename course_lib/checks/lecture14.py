"""Checks for the exercises of lecture 14 (transformer parallelism).

- 14.1 one step of the online softmax (running maximum, running sum, unnormalised output),
  driven block by block by the check itself, against the softmax over all the blocks seen so
  far; scores large enough that an exponent without the running maximum overflows;
- 14.2 the zig-zag layout: which positions a rank holds, against the two properties that make
  it the answer (every position once, equal causal work on every rank);
- 14.3 the vocabulary-parallel cross-entropy on real engines, against one process's
  cross-entropy, with the communicator's counters: an answer that gathers the logits moves too
  much. While the student's function runs, the library's own version refuses to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, raise_as_in_the_notebook, refusing, run_check
from course_lib.i18n import N_, _

__all__ = [
    "REFUSED",
    "check_online_softmax",
    "check_vocab_loss",
    "check_vocab_loss_on_rank",
    "check_zigzag",
    "stub_online_softmax",
    "stub_vocab_loss",
    "stub_zigzag",
]

_T = "course_lib.parallel.transformer"
REFUSED = {
    "14.3": {
        f"{_T}.vocab.vocab_parallel_cross_entropy": N_(
            "that is the answer; write the loss from comm's collectives yourself"
        )
    },
}


def stub_online_softmax(m: Any, ell: Any, acc: Any, scores: Any, values: Any) -> Any:
    """The released stub of Exercise 14.1."""
    raise NotImplementedError("Exercise 14.1: update the running maximum, sum and output")


def stub_zigzag(length: int, world_size: int, rank: int) -> Any:
    """The released stub of Exercise 14.2."""
    raise NotImplementedError("Exercise 14.2: return the positions this rank holds")


def stub_vocab_loss(comm: Any, logits: Any, target: Any, bounds: Any) -> Any:
    """The released stub of Exercise 14.3."""
    raise NotImplementedError("Exercise 14.3: the cross-entropy from this rank's classes")


# ---- 14.1 ----------------------------------------------------------------------------------
def _online_body(fn: Callable) -> str:
    import torch

    gen = torch.Generator().manual_seed(14)
    rows, width = 4, 3
    # the maximum rises from block to block (earlier terms must be rescaled), falls once, and
    # the scores reach hundreds, where exp() of a raw score overflows float32
    spreads = [(1.0, 0.0), (3.0, 50.0), (2.0, 200.0), (5.0, 20.0), (1.0, 400.0)]
    blocks = [
        (torch.randn(rows, n, generator=gen) * s + shift, torch.randn(n, width, generator=gen))
        for n, (s, shift) in zip((2, 3, 1, 4, 2), spreads, strict=True)
    ]
    m, ell, acc = torch.full((rows,), float("-inf")), torch.zeros(rows), torch.zeros(rows, width)
    for i, (scores, values) in enumerate(blocks):
        got = fn(m.clone(), ell.clone(), acc.clone(), scores.clone(), values.clone())
        if not isinstance(got, tuple) or len(got) != 3:
            raise AssertionError(_("return the three running quantities (m, ell, acc) as a tuple"))
        m, ell, acc = (torch.as_tensor(g, dtype=torch.float32) for g in got)
        seen_s = torch.cat([s for s, _v in blocks[: i + 1]], dim=1)
        seen_v = torch.cat([v for _s, v in blocks[: i + 1]])
        if not torch.isfinite(acc).all() or not torch.isfinite(ell).all():
            raise AssertionError(
                _("after block {block}: the running sum or output overflowed").format(block=i + 1)
            )
        if not torch.allclose(m, seen_s.amax(1)):
            raise AssertionError(
                _("after block {block}: m is not the largest score seen so far").format(block=i + 1)
            )
        want = torch.softmax(seen_s, dim=1) @ seen_v
        error = (acc / ell.unsqueeze(1) - want).abs().max().item()
        if error > 1e-5:
            raise AssertionError(
                _(
                    "after block {block}: acc / ell differs from the softmax over the blocks seen "
                    "so far by {error} (what happens to the earlier terms when m changes?)"
                ).format(block=i + 1, error=f"{error:.3g}")
            )
    return _("{n} blocks, scores up to {top}").format(n=len(blocks), top=int(blocks[-1][0].max()))


def check_online_softmax(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 14.1: drive ``fn(m, ell, acc, scores, values)`` block by block; print the verdict."""
    return run_check("14.1", "online softmax", lambda: _online_body(fn), verbose=verbose)


# ---- 14.2 ----------------------------------------------------------------------------------
def _zigzag_body(fn: Callable) -> str:
    for length, p in ((16, 2), (24, 3), (32, 4), (64, 8)):
        held = [[int(t) for t in fn(length, p, r)] for r in range(p)]
        if sorted(t for rows in held for t in rows) != list(range(length)):
            raise AssertionError(
                _("T={length}, {p} ranks: not every position is held exactly once").format(
                    length=length, p=p
                )
            )
        if {len(rows) for rows in held} != {length // p}:
            raise AssertionError(
                _("T={length}, {p} ranks: ranks hold different numbers of tokens").format(
                    length=length, p=p
                )
            )
        # causal work: a query at position t meets t + 1 keys
        work = [sum(t + 1 for t in rows) for rows in held]
        if len(set(work)) != 1:
            raise AssertionError(
                _(
                    "T={length}, {p} ranks: the keys met by each rank's queries are {work}: the "
                    "causal work is not balanced"
                ).format(length=length, p=p, work=work)
            )
    return _("every position once, equal causal work, 4 sizes")


def check_zigzag(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 14.2: check ``fn(length, world_size, rank)`` on four sizes; print the verdict."""
    return run_check("14.2", "zig-zag layout", lambda: _zigzag_body(fn), verbose=verbose)


# ---- 14.3 ----------------------------------------------------------------------------------
def check_vocab_loss_on_rank(comm: Any, fn: Callable) -> str:
    """Run ``fn(comm, logits, target, bounds)`` on this rank; raise AssertionError when wrong."""
    import torch
    import torch.nn.functional as F

    from course_lib.comm.buffers import chunk_bounds

    p, r = comm.world_size, comm.rank
    for tokens, vocab in ((3, p), (8, 2 * p + 1), (20, 11 * p + 3)):
        gen = torch.Generator().manual_seed(tokens)  # the same logits and targets everywhere
        logits = torch.randn(tokens, vocab, generator=gen) * 40  # exp(raw logit) overflows
        target = torch.randint(0, vocab, (tokens,), generator=gen)
        want = F.cross_entropy(logits, target, reduction="none")
        a, b = bounds = chunk_bounds(vocab, p)[r]
        comm.stats.reset()
        with refusing(REFUSED["14.3"], fn):
            got = fn(comm, logits[:, a:b].clone(), target.clone(), bounds)
        where = _("rank {rank}, {tokens} tokens, {vocab} classes").format(
            rank=r, tokens=tokens, vocab=vocab
        )
        error, got = None, torch.as_tensor(got)
        if tuple(got.shape) != (tokens,):
            error = _("{where}: result has shape {got}, expected ({tokens},)").format(
                where=where, got=tuple(got.shape), tokens=tokens
            )
        elif not torch.allclose(got.float(), want, atol=1e-4, rtol=1e-5):
            error = _("{where}: differs from one process's cross-entropy by {error}").format(
                where=where, error=f"{(got - want).abs().max():.3g}"
            )
        else:
            moved = comm.stats.bytes_sent + sum(c.bytes for c in comm.stats.collectives.values())
            if moved > 3 * tokens * 4:
                error = _(
                    "{where}: handed {moved} bytes to the network; a few numbers per token "
                    "suffice, never the logits themselves"
                ).format(where=where, moved=moved)
        failed = comm.allreduce(np.array([1 if error else 0], dtype=np.int64), op="max")
        if failed[0]:  # every rank stops at the same case, or the others would wait
            raise AssertionError(
                error or _("{where}: another rank's result was wrong").format(where=where)
            )
    return _("{p} ranks, 3 sizes, a few floats per token").format(p=p)


def _engine_check(name: str, fn: Callable) -> str:
    from IPython import get_ipython

    from course_lib.checks.lecture14 import check_vocab_loss_on_rank

    return check_vocab_loss_on_rank(get_ipython().user_ns[name], fn)


def check_vocab_loss(
    fn: Callable,
    cluster: Any,
    *,
    comm_name: str = "comm",
    verbose: bool = True,
    timeout: float = 90.0,
) -> Verdict:
    """Exercise 14.3: run ``fn(comm, logits, target, bounds)`` on every engine; print the verdict."""

    def body() -> str:
        try:
            return cluster.run(_engine_check, comm_name, fn, timeout=timeout)[0]
        except Exception as exc:  # noqa: BLE001 - ipyparallel wraps the engine's exception
            raise_as_in_the_notebook(exc, _("Exercise 14.3: write the vocabulary-parallel loss"))

    return run_check("14.3", "vocabulary-parallel cross-entropy", body, verbose=verbose)
