"""Checks for the exercises of lecture 11 (memory: ZeRO's bytes per rank, stage 1's shard update).

Both run in this process (no engines): 11.1 against the formulas of ZeRO (Rajbhandari et al.
2020), 11.2 against ``torch.optim.Adam`` run by one process on the mean gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.checks.verdict import Verdict, run_check
from course_lib.comm.buffers import chunk_bounds
from course_lib.i18n import _
from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes

__all__ = ["check_bytes_per_rank", "check_shard_update", "stub_bytes_per_rank", "stub_shard_update"]

#: Library functions that answer Exercise 11.1 in one call: the check refuses them.
_ANSWERS_11_1 = ("formula_bytes", "mixed_precision_bytes")


def stub_bytes_per_rank(stage: int, psi: int, world_size: int, mixed: bool) -> float:
    """The released stub of Exercise 11.1."""
    raise NotImplementedError("Exercise 11.1: return the model-state bytes one rank holds")


def stub_shard_update(weights, grad_sum, rank, world_size, m, v, step, lr):
    """The released stub of Exercise 11.2."""
    raise NotImplementedError("Exercise 11.2: return (new_shard, m, v) for this rank's chunk")


def _expected(stage: int, psi: int, n: int, mixed: bool) -> float:
    return mixed_precision_bytes(stage, psi, n) if mixed else formula_bytes(stage, psi, n)


def _bytes_body(fn: Callable) -> str:
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    scope = getattr(fn, "__globals__", {})
    answers = {formula_bytes, mixed_precision_bytes}
    called = sorted(n for n in names if n in _ANSWERS_11_1 or scope.get(n) in answers)
    if called:  # by name, or under another name (import ... as f)
        raise AssertionError(
            _(
                "your function calls {name} (the library's formula): count the bytes per value "
                "yourself (weights, gradients, optimiser state; which of them are divided by N)"
            ).format(name=called[0])
        )
    cases = [(s, psi, n, mixed) for mixed in (False, True) for s in range(4)
             for psi in (1_000_000, 7) for n in (1, 2, 4, 64)]  # fmt: skip
    for stage, psi, n, mixed in cases:
        got, want = float(fn(stage, psi, n, mixed)), _expected(stage, psi, n, mixed)
        if abs(got - want) <= 1e-9 * want:
            continue
        what = _("stage {stage}, psi={psi}, N={n}, {precision}").format(
            stage=stage, psi=psi, n=n, precision=_("mixed precision") if mixed else "float32"
        )
        hint = _(
            "expected the weights, gradients and Adam's two moments (16 bytes per value in all)"
        )
        if stage >= 2 and abs(got - _expected(stage - 1, psi, n, mixed)) <= 1e-9 * want:
            hint = (
                _("that is stage 1's count: stage 2 shards the gradients too")
                if stage == 2
                else _("that is stage 2's count: stage 3 shards the weights too (everything / N)")
            )
        elif (
            mixed
            and stage > 0
            and abs(got - mixed_precision_bytes(stage, psi, n, k=8)) <= 1e-9 * want
        ):
            hint = _(
                "the optimiser state in mixed precision includes a float32 master copy of the "
                "weights: K = 12, not 8"
            )
        elif not mixed and abs(got - mixed_precision_bytes(stage, psi, n)) <= 1e-9 * want:
            hint = _(
                "that is mixed precision's count; in float32 the weights and gradients take 4 "
                "bytes each and Adam 8"
            )
        raise AssertionError(
            _("{what}: got {got} bytes, expected {want}; {hint}").format(
                what=what, got=f"{got:g}", want=f"{want:g}", hint=hint
            )
        )
    return _("{n} cases: stages 0-3, float32 and mixed precision, N up to 64").format(n=len(cases))


def check_bytes_per_rank(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 11.1: ``fn(stage, psi, world_size, mixed)`` is ZeRO's model-state bytes per rank."""
    return run_check("11.1", "bytes per rank", lambda: _bytes_body(fn), verbose=verbose)


def _shard_body(fn: Callable) -> str:
    lr, steps = 1e-2, 3
    for numel, n in ((103, 4), (50, 3), (16, 2)):
        gen = torch.Generator().manual_seed(numel)
        start = torch.randn(numel, generator=gen)
        reference = torch.nn.Parameter(start.clone())
        adam = torch.optim.Adam([reference], lr=lr)
        weights = start.clone()
        bounds = chunk_bounds(numel, n)
        state = [(torch.zeros(b - a), torch.zeros(b - a)) for a, b in bounds]
        for step in range(1, steps + 1):
            grads = [torch.randn(numel, generator=gen) for _rank in range(n)]
            total = torch.stack(grads).sum(0)  # what the reduce-scatter adds up
            reference.grad = total / n
            adam.step()
            shards = []
            for rank, (a, b) in enumerate(bounds):
                out = fn(weights.clone(), total[a:b].clone(), rank, n, *state[rank], step, lr)
                shard, m, v = (torch.as_tensor(t, dtype=torch.float32) for t in out)
                where = _("numel={numel}, N={n}, rank {rank}, step {step}").format(
                    numel=numel, n=n, rank=rank, step=step
                )
                if shard.shape != (b - a,):
                    raise AssertionError(
                        _(
                            "{where}: the shard has {got} values, rank {rank}'s chunk {want} (the "
                            "ring's layout: the first numel % N chunks one longer)"
                        ).format(where=where, got=tuple(shard.shape), rank=rank, want=b - a)
                    )
                want_m = adam.state[reference]["exp_avg"][a:b]
                if torch.allclose(m, n * want_m, rtol=1e-4, atol=1e-7) and n > 1:
                    raise AssertionError(
                        _(
                            "{where}: Adam's first moment is N times one process's: grad_sum is "
                            "the sum over the ranks (the reduce-scatter adds), divide it by N"
                        ).format(where=where)
                    )
                if not torch.allclose(m, want_m, rtol=1e-4, atol=1e-7):
                    raise AssertionError(
                        _("{where}: Adam's first moment m differs from one process's").format(
                            where=where
                        )
                    )
                want = reference.detach()[a:b]
                if not torch.allclose(shard, want, rtol=1e-5, atol=1e-6):
                    err = float((shard - want).abs().max())
                    raise AssertionError(
                        _(
                            "{where}: the updated shard differs from one process's Adam by {err} "
                            "(bias correction uses the step number, counted from 1)"
                        ).format(where=where, err=f"{err:.1e}")
                    )
                shards.append(shard)
                state[rank] = (m, v)
            weights = torch.cat(shards)  # the allgather
    return _("3 uneven layouts x 3 Adam steps: the gathered shards equal one process's weights")


def check_shard_update(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 11.2: ``fn`` updates a rank's shard from its reduce-scattered gradient sum (stage 1)."""
    return run_check("11.2", "stage-1 shard update", lambda: _shard_body(fn), verbose=verbose)
