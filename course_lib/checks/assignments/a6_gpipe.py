"""The engine side of A6.3 and A6.4: one GPipe step, and training with it, on 3 stages.

Every engine cuts the same 7-layer MLP (:func:`pipeline_model`) into its stage and computes the
whole model's full-batch gradients and SGD steps in one process itself. A stage sends m
activations to the next stage and m gradients to the previous one, each of a micro-batch's size,
and calls no collective. The stage handed to the student's step records the order of its forward
and backward passes, so a naive schedule (F B F B) fails A6.3 although its gradients are right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.checks.assignments.a6_counters import (
    TRAIN_LR,
    TRAIN_STEPS,
    builtins_used,
    close,
    p2p_traffic,
)

__all__ = [
    "PIPELINE_CASES",
    "PIPELINE_WIDTHS",
    "STAGES",
    "pipeline_case",
    "pipeline_model",
    "pipeline_training",
    "recorded_stage",
    "reference_training",
]

PIPELINE_WIDTHS = (6, 10, 7, 4)  # stage s receives micro-batches of PIPELINE_WIDTHS[s] features
PIPELINE_CASES = ((12, 4), (9, 3))  # (batch, micro-batches)


def pipeline_model(seed: int = 6) -> Any:
    """Return the 7-layer MLP the pipeline checks cut into 3 stages (layers 0:2, 2:4, 4:7)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    a, b, c, d = PIPELINE_WIDTHS
    return nn.Sequential(
        nn.Linear(a, b),
        nn.Tanh(),
        nn.Linear(b, c),
        nn.ReLU(),
        nn.Linear(c, 9),
        nn.Tanh(),
        nn.Linear(9, d),
    )


STAGES = ((0, 2), (2, 4), (4, 7))


def recorded_stage(model: Any, rank: int, log: list[str]) -> Any:
    """Return this rank's layers as a module that logs "F" per forward and "B" per backward."""
    from torch import nn

    class RecordedStage(nn.Sequential):
        def forward(self, x):
            log.append("F")
            out = super().forward(x)
            if out.requires_grad:
                out.register_hook(lambda grad: log.append("B"))
            return out

    lo, hi = STAGES[rank]
    return RecordedStage(*model[lo:hi])


def pipeline_case(comm: Any, step: Callable, batch: int, m: int, seed: int) -> str:
    """Run one ``step`` on this rank's stage; return "" or what is wrong."""
    import torch
    import torch.nn.functional as F

    s, p = comm.rank, comm.world_size
    log: list[str] = []
    stage, model = (
        recorded_stage(pipeline_model(seed), s, log),
        pipeline_model(seed),
    )  # model: reference
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, PIPELINE_WIDTHS[0], generator=gen)
    y = torch.randint(0, PIPELINE_WIDTHS[-1], (batch,), generator=gen)
    shapes = [(batch // m, w) for w in PIPELINE_WIDTHS[:p]]
    case = f"batch {batch}, m = {m}, stage {s}"
    comm.stats.reset()
    loss = step(comm, stage, X if s == 0 else None, y if s == p - 1 else None, m, shapes)
    used, p2p = builtins_used(comm), p2p_traffic(comm)
    ref_loss = F.cross_entropy(model(X), y)
    ref_loss.backward()
    lo, hi = STAGES[s]
    ref = [q.grad.clone() for q in model[lo:hi].parameters()]
    got = [q.grad for q in stage.parameters()]
    if any(g is None for g in got):
        return f"{case}: a parameter of the stage has no gradient: run the backward passes"
    if not all(close(g, r) for g, r in zip(got, ref, strict=True)):
        if all(close(g, m * r) for g, r in zip(got, ref, strict=True)):
            return (
                f"{case}: the gradients are m = {m} times too large: the batch loss is the "
                "mean of the micro-batch means, divide each micro-batch's loss by m"
            )
        model.zero_grad()
        F.cross_entropy(model(X[-(batch // m) :]), y[-(batch // m) :]).backward()
        last = [q.grad for q in model[lo:hi].parameters()]
        if all(close(g, r) or close(g, r / m) for g, r in zip(got, last, strict=True)):
            return (
                f"{case}: only the last micro-batch's gradient is left: accumulate into "
                ".grad over the m micro-batches (never zero it inside the step)"
            )
        return f"{case}: the gradients differ from one full-batch backward in one process"
    if s == p - 1 and (loss is None or abs(float(loss) - ref_loss.item()) > 1e-5):
        return f"{case}: returned loss {loss}, the batch's mean loss is {ref_loss.item():.6f}"
    want = {}
    if s < p - 1:  # activations out, their gradients back, m of each, a micro-batch each
        n = m * (batch // m) * PIPELINE_WIDTHS[s + 1] * 4
        want[s + 1] = (m, n, m, n)
    if s > 0:
        n = m * (batch // m) * PIPELINE_WIDTHS[s] * 4
        want[s - 1] = (m, n, m, n)
    if used or p2p != want:

        def show(d: dict) -> dict:
            return {
                q: f"{a} messages / {b} bytes out, {c} / {e} in" for q, (a, b, c, e) in d.items()
            }

        return (
            f"{case}: rank {s} talked to {show(p2p) or 'nobody'}"
            f"{f' and called {sorted(used)}' if used else ''}; a stage exchanges only with "
            f"its neighbours, one micro-batch a message, no collective: {show(want)}"
        )
    if log != ["F"] * m + ["B"] * m:
        return (
            f"{case}: the stage ran {' '.join(log)}; GPipe runs all m forwards, then the "
            "m backwards"
        )
    return ""


def reference_training(batches: list, zero_grad: bool) -> Any:
    """Return the model trained on ``batches`` in one process (SGD, momentum 0.9)."""
    import torch
    import torch.nn.functional as F

    model = pipeline_model(7)
    opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR, momentum=0.9)
    for X, y in batches:
        if zero_grad:
            opt.zero_grad()
        F.cross_entropy(model(X), y).backward()
        opt.step()
    return model


def pipeline_training(comm: Any, train: Callable) -> str:
    """Run ``train`` for TRAIN_STEPS batches of 16 (m = 4) on this stage; compare the weights."""
    import torch

    s, p = comm.rank, comm.world_size
    stage = recorded_stage(pipeline_model(7), s, [])
    gen = torch.Generator().manual_seed(64)
    batches = [
        (
            torch.randn(16, PIPELINE_WIDTHS[0], generator=gen),
            torch.randint(0, PIPELINE_WIDTHS[-1], (16,), generator=gen),
        )
        for _ in range(TRAIN_STEPS)
    ]
    mine = [(X if s == 0 else None, y if s == p - 1 else None) for X, y in batches]
    comm.stats.reset()
    train(comm, stage, mine, TRAIN_LR, 4, [(4, w) for w in PIPELINE_WIDTHS[:p]])
    if builtins_used(comm) or sum(m for m, *_ in p2p_traffic(comm).values()) != TRAIN_STEPS * 4 * (
        1 if s in (0, p - 1) else 2
    ):
        return f"stage {s}: {TRAIN_STEPS} steps need {TRAIN_STEPS} calls of your gpipe_step"
    lo, hi = STAGES[s]
    weights = [q.detach() for q in stage.parameters()]
    for zero_grad in (True, False):
        want = reference_training(batches, zero_grad)[lo:hi].parameters()
        if all(close(g, w.detach()) for g, w in zip(weights, want, strict=True)):
            kept = "the gradients of earlier steps were kept: gpipe_step accumulates into .grad"
            return "" if zero_grad else f"{kept}, so zero them before each step (zero_grad())"
    return (
        f"after {TRAIN_STEPS} steps the weights of stage {s} differ from the same model "
        "trained in one process (SGD, momentum 0.9, lr)"
    )
