"""Checks for the exercises of lecture 15 (experts and all-to-all).

15.1 runs the student's all-to-all on every engine against the transpose of every rank's blocks
(each rank knows every rank's input) and reads the counters: point-to-point messages only, one
to each other rank, carrying exactly that rank's block. 15.2 runs the student's router on
random logits in this process against the library's :func:`~course_lib.parallel.experts.route`,
with cases that overflow the capacity. While the student's function runs, the library's
answers refuse to (:func:`course_lib.checks.verdict.refusing`); failure messages say where the
answer differs, never what it should be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, raise_as_in_the_notebook, refusing, run_check
from course_lib.i18n import N_, _

__all__ = [
    "REFUSED",
    "check_all_to_all",
    "check_all_to_all_on_rank",
    "check_route",
    "stub_all_to_all",
    "stub_route",
]

REFUSED = {
    "15.1": {
        "course_lib.collectives.all_to_all.pairwise_all_to_all": N_(
            "post comm.sendrecv calls yourself"
        ),
        "course_lib.collectives.all_to_all.all_to_all_naive": N_(
            "post comm.sendrecv calls yourself"
        ),
        "course_lib.comm.communicator.Communicator.all_to_all": N_(
            "that is the built-in; write it from comm.sendrecv"
        ),
    },
    "15.2": {
        "course_lib.parallel.experts.gating.route": N_("count the slots per expert yourself"),
    },
}


def stub_all_to_all(comm: Any, x: Any) -> Any:
    """The released stub of Exercise 15.1."""
    raise NotImplementedError("Exercise 15.1: exchange the blocks pairwise with comm.sendrecv")


def stub_route(logits: Any, k: int, cap: int) -> Any:
    """The released stub of Exercise 15.2."""
    raise NotImplementedError("Exercise 15.2: pick the k best experts and hand out the slots")


def check_all_to_all_on_rank(comm: Any, fn: Callable) -> str:
    """Run ``fn(comm, x)`` on this rank for several shapes; raise AssertionError when wrong."""
    import torch

    p, r = comm.world_size, comm.rank
    for rows, width in ((p, 1), (2 * p, 3), (3 * p, 17)):
        gen = torch.Generator().manual_seed(rows * 100 + width)
        every = torch.randn(p, rows, width, generator=gen)  # every rank's input, known to all
        b = rows // p
        want = torch.cat([every[i, r * b : (r + 1) * b] for i in range(p)])
        comm.stats.reset()
        with refusing(REFUSED["15.1"], fn):
            got = fn(comm, every[r].clone())
        where = _("rank {rank}, x of shape {shape}").format(rank=r, shape=(rows, width))
        error = None
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(want.shape):
            error = _("{where}: result has shape {got}, expected {want}").format(
                where=where, got=tuple(got.shape), want=tuple(want.shape)
            )
        elif not torch.equal(got, want):
            wrong = [
                i
                for i in range(p)
                if not torch.equal(got[i * b : (i + 1) * b], want[i * b : (i + 1) * b])
            ]
            error = _(
                "{where}: the block in position {i} of the result is not the one rank {i} "
                "addressed to this rank"
            ).format(where=where, i=wrong[0])
        else:
            error = _traffic(comm, b * width * 4, where)
        failed = comm.allreduce(np.array([1 if error else 0], dtype=np.int64), op="max")
        if failed[0]:  # every rank stops at the same case, or the others would wait
            raise AssertionError(
                error or _("{shape}: another rank's result was wrong").format(shape=(rows, width))
            )
    return _("{p} ranks, 3 shapes, {n} messages of one block each").format(p=p, n=p - 1)


def _traffic(comm: Any, block: int, where: str) -> str | None:
    builtins = sorted(comm.stats.collectives)
    if builtins:
        return _(
            "{where}: uses the built-in collective(s) {builtins}; send blocks point-to-point"
        ).format(where=where, builtins=builtins)
    peers = {q: s for q, s in comm.stats.peers.items() if s.messages_sent}
    others = set(range(comm.world_size)) - {comm.rank}
    if set(peers) != others or any(s.messages_sent != 1 for s in peers.values()):
        sent = {q: s.messages_sent for q, s in sorted(peers.items())}
        return _(
            "{where}: messages sent per peer {sent}; pairwise exchange sends one to each other rank"
        ).format(where=where, sent=sent)
    if any(s.bytes_sent != block for s in peers.values()):
        return _("{where}: a message carries more than the block its receiver needs").format(
            where=where
        )
    return None


def _engine_check(name: str, fn: Callable) -> str:
    from IPython import get_ipython

    from course_lib.checks.lecture15 import check_all_to_all_on_rank

    return check_all_to_all_on_rank(get_ipython().user_ns[name], fn)


def check_all_to_all(
    fn: Callable,
    cluster: Any,
    *,
    comm_name: str = "comm",
    verbose: bool = True,
    timeout: float = 90.0,
) -> Verdict:
    """Check Exercise 15.1 on every engine of ``cluster``; print and return the verdict."""

    def body() -> str:
        try:
            return cluster.run(_engine_check, comm_name, fn, timeout=timeout)[0]
        except Exception as exc:  # noqa: BLE001 - ipyparallel wraps the engine's exception
            raise_as_in_the_notebook(exc, _("Exercise 15.1: write my_all_to_all"))

    return run_check("15.1", "pairwise_all_to_all", body, verbose=verbose)


def check_route(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 15.2 in this process against the library's router; print and return the verdict."""

    def body() -> str:
        import torch

        from course_lib.parallel.experts.gating import route

        cases, dropped = 0, 0
        for seed, (T, E, k, cap) in enumerate(
            [(6, 2, 1, 3), (12, 4, 2, 4), (20, 5, 2, 3), (9, 3, 3, 9)]
        ):
            logits = torch.randn(T, E, generator=torch.Generator().manual_seed(seed)) * 2
            logits[: T // 2, 0] += 3  # a popular expert: its slots run out
            want = route(logits, k, cap)
            with refusing(REFUSED["15.2"], fn):
                got = fn(logits.clone(), k, cap)
            if not isinstance(got, tuple) or len(got) != 2:
                raise AssertionError(_("return a pair (expert, slot) of (T, k) integer tensors"))
            expert, slot = (torch.as_tensor(g) for g in got)
            where = _("T={T}, E={E}, k={k}, capacity {cap}").format(T=T, E=E, k=k, cap=cap)
            for label, g, w in (("expert", expert, want.expert), ("slot", slot, want.slot)):
                if tuple(g.shape) != tuple(w.shape):
                    raise AssertionError(
                        _("{where}: {label} has shape {got}, expected {want}").format(
                            where=where, label=label, got=tuple(g.shape), want=tuple(w.shape)
                        )
                    )
                bad = (g.long() != w).nonzero()
                if len(bad):
                    t, c = (int(v) for v in bad[0])
                    raise AssertionError(
                        _("{where}: token {t}, choice {c}: the {label} differs").format(
                            where=where, t=t, c=c, label=label
                        )
                    )
            cases, dropped = cases + 1, dropped + want.dropped
        return _("{cases} cases, {dropped} dropped choices found").format(
            cases=cases, dropped=dropped
        )

    return run_check("15.2", "route_with_capacity", body, verbose=verbose)
