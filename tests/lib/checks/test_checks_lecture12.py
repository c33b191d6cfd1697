"""Lecture 12's exercise checks: the instructor's answers pass; the notebook's own stubs, the
tempting mistakes and answers that delegate to the library fail, each naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lecture12_answers import my_goyal_lr, my_lars_update, my_noise_estimates

from course_lib.checks.lecture12 import check_goyal_lr, check_lars_update, check_noise_estimates
from course_lib.parallel.large_batch.noise_scale import noise_estimates
from course_lib.training.layerwise import LARS
from course_lib.training.lr_schedules import LinearScalingWarmup, linear_scaled_lr

NOTEBOOK = Path(__file__).resolve().parents[3] / "notebooks" / "12_large_batches.ipynb"


def notebook_stub(name: str):
    """Return the function ``name`` as the notebook's exercise cell defines it (the stub)."""
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(f"def {name}("):
            namespace: dict = {"np": np}
            exec(source, namespace)  # noqa: S102 - the notebook's own cell, as a student runs it
            return namespace[name]
    raise AssertionError(f"no exercise cell defines {name} in {NOTEBOOK.name}")


def _fails(verdict, *phrases: str) -> None:
    assert not verdict, verdict
    for phrase in phrases:
        assert phrase in verdict.detail, verdict.detail


# ---- 12.1 ---------------------------------------------------------------------------------------
def warmup_from_zero(step, *, base_lr, batch_size, reference_batch, warmup_steps, decay_steps=()):
    peak = base_lr * batch_size / reference_batch
    lr = peak * step / warmup_steps if step < warmup_steps else peak
    return lr * 0.1 ** sum(step >= d for d in decay_steps)


def sqrt_scaling(step, *, base_lr, batch_size, reference_batch, warmup_steps, decay_steps=()):
    peak = base_lr * (batch_size / reference_batch) ** 0.5
    lr = base_lr + (peak - base_lr) * step / warmup_steps if step < warmup_steps else peak
    return lr * 0.1 ** sum(step >= d for d in decay_steps)


def no_decay(step, *, base_lr, batch_size, reference_batch, warmup_steps, decay_steps=()):
    peak = base_lr * batch_size / reference_batch
    return base_lr + (peak - base_lr) * step / warmup_steps if step < warmup_steps else peak


def delegating_schedule(
    step, *, base_lr, batch_size, reference_batch, warmup_steps, decay_steps=()
):
    schedule = LinearScalingWarmup(reference_batch=reference_batch, warmup_steps=warmup_steps)
    lr = schedule.lr_at(step, base_lr=base_lr, batch_size=batch_size, steps_per_epoch=10)
    return lr * 0.1 ** sum(step >= d for d in decay_steps)


def delegating_peak(step, *, base_lr, batch_size, reference_batch, warmup_steps, decay_steps=()):
    peak = linear_scaled_lr(base_lr, batch_size, reference_batch)  # imported into this module
    lr = base_lr + (peak - base_lr) * step / warmup_steps if step < warmup_steps else peak
    return lr * 0.1 ** sum(step >= d for d in decay_steps)


def test_goyal_schedule_check():
    passed = check_goyal_lr(my_goyal_lr, verbose=False)
    assert passed, passed.detail
    _fails(check_goyal_lr(notebook_stub("my_goyal_lr"), verbose=False), "not implemented yet")
    _fails(check_goyal_lr(warmup_from_zero, verbose=False), "starts from base_lr")
    _fails(check_goyal_lr(sqrt_scaling, verbose=False), "square-root scaling")
    _fails(check_goyal_lr(no_decay, verbose=False), "divided by 10")
    _fails(check_goyal_lr(delegating_schedule, verbose=False), "library's", "lr_at")
    _fails(check_goyal_lr(delegating_peak, verbose=False), "library's", "linear_scaled_lr")
    assert check_goyal_lr(my_goyal_lr, verbose=False)  # the library is back after a refusal
    assert LinearScalingWarmup(reference_batch=8).peak_lr(0.1, 16) == pytest.approx(0.2)


# ---- 12.2 ---------------------------------------------------------------------------------------
def averaged_as_truth(local_sq_norms, averaged_sq_norm, local_batch):
    """|G_B|^2 taken as |G|^2, and the ranks' excess over it times b as tr(Sigma)."""
    small = float(np.mean(local_sq_norms))
    return averaged_sq_norm, local_batch * (small - averaged_sq_norm)


def forgets_the_big_batch_noise(local_sq_norms, averaged_sq_norm, local_batch):
    """The right |G|^2, but tr(Sigma) as if the averaged gradient had no noise."""
    b, big = local_batch, local_batch * len(local_sq_norms)
    small = float(np.mean(local_sq_norms))
    return (big * averaged_sq_norm - b * small) / (big - b), b * (small - averaged_sq_norm)


def delegating_estimates(local_sq_norms, averaged_sq_norm, local_batch):
    b = local_batch
    return noise_estimates(
        float(np.mean(local_sq_norms)), averaged_sq_norm, b, b * len(local_sq_norms)
    )


def test_noise_estimates_check():
    passed = check_noise_estimates(my_noise_estimates, verbose=False)
    assert passed and "unbiased" in passed.detail, passed.detail
    stub = check_noise_estimates(notebook_stub("my_noise_estimates"), verbose=False)
    _fails(stub, "not implemented yet")
    _fails(check_noise_estimates(averaged_as_truth, verbose=False), "overestimates |G|^2")
    _fails(
        check_noise_estimates(forgets_the_big_batch_noise, verbose=False),
        "treats the averaged gradient as the true one",
    )
    _fails(check_noise_estimates(delegating_estimates, verbose=False), "library's noise_estimates")
    assert noise_estimates(2.0, 1.0, 1, 2) == pytest.approx((0.0, 2.0))  # restored


# ---- 12.3 ---------------------------------------------------------------------------------------
def no_zero_guard(w, g, v, *, lr, momentum, weight_decay, eta):
    ratio = np.linalg.norm(w) / (np.linalg.norm(g) + weight_decay * np.linalg.norm(w))
    v = momentum * v + lr * eta * ratio * (g + weight_decay * w)
    return w - v, v


def eta_where_the_norm_is_zero(w, g, v, *, lr, momentum, weight_decay, eta):
    """The trust coefficient kept where the ratio is undefined: a zero bias moves 1/eta less."""
    wn, gn = np.linalg.norm(w), np.linalg.norm(g)
    ratio = wn / (gn + weight_decay * wn) if wn > 0 and gn > 0 else 1.0
    v = momentum * v + lr * eta * ratio * (g + weight_decay * w)
    return w - v, v


def decay_outside_the_ratio(w, g, v, *, lr, momentum, weight_decay, eta):
    """Trust ratio ||w|| / ||g||, leaving weight decay out of the denominator."""
    wn, gn = np.linalg.norm(w), np.linalg.norm(g)
    local = eta * wn / gn if wn > 0 and gn > 0 else 1.0
    v = momentum * v + lr * local * (g + weight_decay * w)
    return w - v, v


def delegating_lars(w, g, v, *, lr, momentum, weight_decay, eta):
    p = torch.nn.Parameter(torch.from_numpy(w.copy()))
    p.grad = torch.from_numpy(g.copy())
    opt = LARS([p], lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=eta)
    opt.state[p]["velocity"] = torch.from_numpy(v.copy())
    opt.step()
    return p.detach().numpy(), opt.state[p]["velocity"].numpy()


def test_lars_update_check():
    passed = check_lars_update(my_lars_update, verbose=False)
    assert passed, passed.detail
    _fails(check_lars_update(notebook_stub("my_lars_update"), verbose=False), "not implemented")
    _fails(
        check_lars_update(no_zero_guard, verbose=False), "bias initialised at zero", "eta included"
    )
    _fails(check_lars_update(decay_outside_the_ratio, verbose=False), "||g|| + beta ||w||")
    _fails(check_lars_update(eta_where_the_norm_is_zero, verbose=False), "eta included")
    _fails(check_lars_update(delegating_lars, verbose=False), "library's", "LARS.step")
    assert check_lars_update(delegating_lars, verbose=False).passed is False
    assert check_lars_update(my_lars_update, verbose=False)  # LARS.step restored
