"""The judges of A6.3 and A6.4: one GPipe step, and training with it, on 3 stages.

Every engine cuts the same 7-layer MLP (:func:`pipeline_model`) into its stage, runs the
student's step on it and returns the stage's gradients, the counters and the order of its
passes (:mod:`course_grader.assignments.a6.collect`); the judge computes the whole model's
full-batch gradients and SGD steps in one process itself. A stage sends m activations to the
next stage and m gradients to the previous one, each of a micro-batch's size, and calls no
collective. The stage handed to the student's step records the order of its forward and
backward passes, so a naive schedule (F B F B) fails A6.3 although its gradients are right.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.assignments.a6.collect import (
    PIPELINE_WIDTHS,
    STAGES,
    TRAIN_LR,
    TRAIN_MICROBATCHES,
    TRAIN_STEPS,
    case_seed,
    close,
    p2p_of,
    pipeline_batches,
    pipeline_data,
    pipeline_model,
    recorded_stage,
    used_of,
)
from course_lib.i18n import _

__all__ = [
    "PIPELINE_CASES",
    "PIPELINE_WIDTHS",
    "STAGES",
    "judge_pipeline",
    "judge_pipeline_training",
    "pipeline_cases",
    "pipeline_model",
    "recorded_stage",
    "reference_training",
    "training_cases",
]

PIPELINE_CASES = ((12, 4), (9, 3))  # (batch, micro-batches)


def pipeline_cases(seed: int | None = None) -> list[dict]:
    """A6.3's cases: one GPipe step per (batch, m), each on its own model and data."""
    return [
        {"kind": "pipeline", "batch": batch, "m": m, "seed": case_seed(k, seed)}
        for k, (batch, m) in enumerate(PIPELINE_CASES)
    ]


def training_cases(seed: int | None = None) -> list[dict]:
    """A6.4's case: ``TRAIN_STEPS`` batches of 16, m = 4."""
    return [{"kind": "pipeline_training", "model_seed": 7, "seed": case_seed(64, seed)}]


def judge_pipeline(case: dict, s: int, p: int, data: Any) -> str:
    """Return "" or what is wrong with stage ``s``'s GPipe step."""
    import torch.nn.functional as F

    batch, m, seed = case["batch"], case["m"], case["seed"]
    model = pipeline_model(seed)  # the reference
    X, y = pipeline_data(batch, seed)
    case = _("batch {batch}, m = {m}, stage {s}").format(batch=batch, m=m, s=s)
    assert isinstance(data, tuple) and len(data) == 5, _("stage {s} returned no result").format(s=s)
    loss, got, used, p2p, log = data
    used, p2p, got = used_of(used), p2p_of(p2p), list(got)
    loss = None if loss is None else float(np.asarray(loss))
    ref_loss = F.cross_entropy(model(X), y)
    ref_loss.backward()
    lo, hi = STAGES[s]
    ref = [q.grad.clone() for q in model[lo:hi].parameters()]
    if len(got) != len(ref) or any(g is None for g in got):
        return _(
            "{case}: a parameter of the stage has no gradient: run the backward passes"
        ).format(case=case)
    if not all(close(g, r) for g, r in zip(got, ref, strict=True)):
        if all(close(g, m * r) for g, r in zip(got, ref, strict=True)):
            return _(
                "{case}: the gradients are m = {m} times too large: the batch loss is the "
                "mean of the micro-batch means, divide each micro-batch's loss by m"
            ).format(case=case, m=m)
        model.zero_grad()
        F.cross_entropy(model(X[-(batch // m) :]), y[-(batch // m) :]).backward()
        last = [q.grad for q in model[lo:hi].parameters()]
        if all(close(g, r) or close(g, r / m) for g, r in zip(got, last, strict=True)):
            return _(
                "{case}: only the last micro-batch's gradient is left: accumulate into "
                ".grad over the m micro-batches (never zero it inside the step)"
            ).format(case=case)
        return _("{case}: the gradients differ from one full-batch backward in one process").format(
            case=case
        )
    if s == p - 1 and (loss is None or abs(loss - ref_loss.item()) > 1e-5):
        return _("{case}: returned loss {loss}, the batch's mean loss is {want}").format(
            case=case, loss=loss, want=f"{ref_loss.item():.6f}"
        )
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
                q: _("{a} messages / {b} bytes out, {c} / {e} in").format(a=a, b=b, c=c, e=e)
                for q, (a, b, c, e) in d.items()
            }

        called = _(" and called {names}").format(names=sorted(used)) if used else ""
        return _(
            "{case}: rank {s} talked to {peers}{called}; a stage exchanges only with "
            "its neighbours, one micro-batch a message, no collective: {want}"
        ).format(case=case, s=s, peers=show(p2p) or _("nobody"), called=called, want=show(want))
    if str(log) != " ".join(["F"] * m + ["B"] * m):
        return _(
            "{case}: the stage ran {log}; GPipe runs all m forwards, then the m backwards"
        ).format(case=case, log=log)
    return ""


def reference_training(batches: list, zero_grad: bool, seed: int = 7, scale: float = 1.0) -> Any:
    """Return the model trained on ``batches`` in one process (SGD, momentum 0.9).

    ``scale`` multiplies each batch's loss: a pipeline that forgets to divide its micro-batches'
    losses by m trains exactly like ``scale = m``, which lets the verdict name that mistake.
    """
    import torch
    import torch.nn.functional as F

    model = pipeline_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR, momentum=0.9)
    for X, y in batches:
        if zero_grad:
            opt.zero_grad()
        (scale * F.cross_entropy(model(X), y)).backward()
        opt.step()
    return model


def judge_pipeline_training(case: dict, s: int, p: int, data: Any) -> str:
    """Return "" or how stage ``s``'s weights after training differ from one process."""
    assert isinstance(data, tuple) and len(data) == 3, _("stage {s} returned no result").format(s=s)
    used, p2p, weights = used_of(data[0]), p2p_of(data[1]), list(data[2])
    sent = sum(messages for messages, *_rest in p2p.values())
    if used or sent != TRAIN_STEPS * 4 * (1 if s in (0, p - 1) else 2):
        return _("stage {s}: {steps} steps need {steps} calls of your gpipe_step").format(
            s=s, steps=TRAIN_STEPS
        )
    lo, hi = STAGES[s]
    batches = pipeline_batches(case["seed"])
    m = TRAIN_MICROBATCHES
    kept = _(
        "the gradients of earlier steps were kept: gpipe_step accumulates into .grad, so zero "
        "them before each step (zero_grad())"
    )
    undivided = _(
        "the weights equal one process trained on m = {m} times the gradient: each "
        "micro-batch's loss must be divided by m (your gpipe_step; A6.3's verdict names it too)"
    ).format(m=m)
    for zero_grad, scale, mistake in (
        (True, 1.0, ""),
        (False, 1.0, kept),
        (True, float(m), undivided),
    ):
        model = reference_training(batches, zero_grad, case["model_seed"], scale)
        want = list(model[lo:hi].parameters())
        if len(weights) == len(want) and all(
            close(g, w.detach()) for g, w in zip(weights, want, strict=True)
        ):
            return mistake
    return _(
        "after {steps} steps the weights of stage {s} differ from the same model "
        "trained in one process (SGD, momentum 0.9, lr)"
    ).format(steps=TRAIN_STEPS, s=s)
