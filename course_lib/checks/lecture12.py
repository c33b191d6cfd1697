"""Checks for the exercises of lecture 12 (large batches).

Exercise 12.1: Goyal et al.'s whole schedule (linear scaling, gradual warm-up, then divisions
by 10), a variant the library does not provide, against its formula on several settings.
Exercise 12.2: the noise-scale estimates from the ranks' and the averaged gradient norms,
exact on fixed inputs and unbiased on a quadratic with known covariance. Exercise 12.3: one
LARS step of one layer against the library's optimiser. Each check runs the student's function
while the library's own version is swapped for one that refuses (in its module, on its class
and in the student's namespace), so an answer that delegates to the library fails, saying so.
Kept whole: three exercises of one lecture, each a short section of cases, reference and the
messages that name the mistake (translatable templates, hence the length).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import N_, _
from course_lib.parallel.large_batch import noise_scale as noise_module
from course_lib.training import layerwise, lr_schedules

__all__ = ["check_goyal_lr", "check_lars_update", "check_noise_estimates"]


@contextlib.contextmanager
def _library_refused(fn: Callable, targets: list[tuple[Any, str]]) -> Iterator[None]:
    """Swap each ``getattr(owner, name)`` for a function that fails, while the block runs.

    The same objects are swapped where the student's function would find them by another
    name: in its module's globals (``from course_lib... import noise_estimates``).
    """
    originals = {(owner, name): getattr(owner, name) for owner, name in targets}

    def refusing(label: str) -> Callable:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(
                _("your function calls the library's {label}: write the formula yourself").format(
                    label=label
                )
            )

        return refuse

    namespace = getattr(fn, "__globals__", {})
    in_namespace = {
        key: value
        for key, value in namespace.items()
        if any(value is original for original in originals.values())
    }
    try:
        for owner, name in originals:
            setattr(owner, name, refusing(f"{getattr(owner, '__name__', owner)}.{name}"))
        for key, value in in_namespace.items():
            namespace[key] = refusing(getattr(value, "__qualname__", key))
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
        namespace.update(in_namespace)


# ---- Exercise 12.1: Goyal et al.'s schedule -----------------------------------------------------
def _goyal(step: int, base_lr: float, batch: int, ref: int, warm: int, decays: tuple) -> float:
    """The schedule from the paper's words (section 2 and 5.1): the check's expected values."""
    peak = base_lr * batch / ref
    if step < warm:
        return base_lr + (peak - base_lr) * step / warm
    return peak * 0.1 ** sum(step >= d for d in decays)


GOYAL_CASES = [  # (base_lr, batch_size, reference_batch, warmup_steps, decay_steps)
    (0.1, 8192, 256, 20, (60, 90)),
    (0.05, 64, 16, 4, (10,)),
    (0.2, 32, 32, 5, ()),  # k = 1: warm-up from the lr to itself
    (0.01, 1024, 64, 1, (3, 5, 7)),
]


def _goyal_body(fn: Callable) -> str:
    refused = [
        (lr_schedules.LinearScalingWarmup, "lr_at"),
        (lr_schedules.LinearScalingWarmup, "peak_lr"),
        (lr_schedules, "linear_scaled_lr"),
    ]
    with _library_refused(fn, refused):
        for base_lr, batch, ref, warm, decays in GOYAL_CASES:
            for step in range(0, (decays[-1] if decays else warm) + 4):
                want = _goyal(step, base_lr, batch, ref, warm, decays)
                got = float(
                    fn(
                        step,
                        base_lr=base_lr,
                        batch_size=batch,
                        reference_batch=ref,
                        warmup_steps=warm,
                        decay_steps=decays,
                    )
                )
                if np.isclose(got, want, rtol=1e-9, atol=1e-15):
                    continue
                setting = _(
                    "base_lr={base_lr}, B={batch}, B_ref={ref}, warm-up {warm} steps"
                ).format(base_lr=base_lr, batch=batch, ref=ref, warm=warm)
                raise AssertionError(
                    _("step {step} ({setting}): got lr {got}, want {want}").format(
                        step=step, setting=setting, got=f"{got:.6g}", want=f"{want:.6g}"
                    )
                    + _goyal_hint(fn, step, got, (base_lr, batch, ref, warm, decays))
                )
    return _("{n} settings, every step through the warm-up and the decays").format(
        n=len(GOYAL_CASES)
    )


def _goyal_hint(fn: Callable, step: int, got: float, setting: tuple) -> str:
    """Name the mistake: the warm-up's start, the scaling rule, the warm-up's shape or the decay."""
    base_lr, batch, ref, warm, decays = setting
    if step == 0 and np.isclose(got, 0.0):
        return _(" (the warm-up starts from base_lr, the small batch's lr, not from 0)")
    peak = base_lr * batch / ref
    options = dict(base_lr=base_lr, batch_size=batch, reference_batch=ref, warmup_steps=warm)
    after_warmup = float(fn(warm, **options, decay_steps=decays))  # before the first decay
    if np.isclose(after_warmup, base_lr * np.sqrt(batch / ref)) and batch != ref:
        return _(
            " (that is square-root scaling; Goyal et al. scale the lr linearly with the batch)"
        )
    if not np.isclose(after_warmup, peak):
        return _(
            " (right after the warm-up the lr is k base_lr = {peak}, with k = B / B_ref)"
        ).format(peak=f"{peak:.6g}")
    if step < warm:
        return _(
            " (during the warm-up the lr grows by the same amount every step, base_lr to k base_lr)"
        )
    return _(" (after each step in decay_steps, the lr is divided by 10 once more)")


def check_goyal_lr(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 12.1: ``fn(step, base_lr=, batch_size=, reference_batch=, warmup_steps=, decay_steps=)``."""
    return run_check("12.1", "Goyal et al.'s schedule", lambda: _goyal_body(fn), verbose=verbose)


# ---- Exercise 12.2: the noise-scale estimates ---------------------------------------------------
def _quadratic_draws(draws: int, ranks: int, b: int, seed: int = 12) -> tuple:
    """Per-rank and averaged squared gradient norms of |theta - x|^2 / 2, x ~ N(mu, Sigma)."""
    rng = np.random.default_rng(seed)
    dim = 5
    mu = rng.normal(size=dim)
    root = rng.normal(size=(dim, dim)) / 2
    theta = mu + rng.normal(size=dim)
    x = mu + rng.normal(size=(draws, ranks, b, dim)) @ root.T
    local = (theta - x).mean(axis=2)  # each rank's gradient over its b examples
    small = np.sum(local**2, axis=2)  # (draws, ranks)
    big = np.sum(local.mean(axis=1) ** 2, axis=1)  # the averaged gradient's
    truth = (float(np.sum((theta - mu) ** 2)), float(np.trace(root @ root.T)))
    return small, big, truth


def _noise_body(fn: Callable) -> str:
    cases = [([4.0, 5.0, 6.0, 5.0], 2.0, 8), ([1.5, 0.5], 0.9, 32), ([3.0] * 8, 1.25, 2)]
    expected = [
        noise_module.noise_estimates(float(np.mean(s)), big, b, b * len(s)) for s, big, b in cases
    ]
    small, big, (true_grad, true_trace) = _quadratic_draws(3000, 4, 4)
    with _library_refused(fn, [(noise_module, "noise_estimates")]):
        for (local, averaged, b), want in zip(cases, expected, strict=True):
            got = tuple(float(v) for v in fn(list(local), averaged, b))
            for label, g, w in zip(("|G|^2", "tr(Sigma)"), got, want, strict=True):
                if not np.isclose(g, w, rtol=1e-9):
                    raise AssertionError(
                        _("{n} ranks of b = {b}: {label} estimate {got}, want {want}").format(
                            n=len(local), b=b, label=label, got=f"{g:.6g}", want=f"{w:.6g}"
                        )
                        + _noise_hint(label, g, local, averaged, b)
                    )
        estimates = np.array([fn(list(s), float(a), 4) for s, a in zip(small, big, strict=True)])
    means = estimates.astype(float).mean(axis=0)
    errors = estimates.astype(float).std(axis=0, ddof=1) / np.sqrt(len(estimates))
    for label, m, e, truth in zip(
        ("|G|^2", "tr(Sigma)"), means, errors, (true_grad, true_trace), strict=True
    ):
        if abs(m - truth) > 5 * e:
            raise AssertionError(
                _("{label} is biased: mean {mean} over 3000 draws, truth {truth}").format(
                    label=label, mean=f"{m:.4g}", truth=f"{truth:.4g}"
                )
            )
    return _(
        "exact on {n} inputs; unbiased on a quadratic with known Sigma (mean tr(Sigma) {trace} "
        "vs {true_trace}, |G|^2 {grad} vs {true_grad})"
    ).format(
        n=len(cases),
        trace=f"{means[1]:.3f}",
        true_trace=f"{true_trace:.3f}",
        grad=f"{means[0]:.3f}",
        true_grad=f"{true_grad:.3f}",
    )


def _noise_hint(label: str, got: float, local: list, averaged: float, b: int) -> str:
    big = b * len(local)
    if label == "|G|^2" and np.isclose(got, averaged):
        return _(" (|G_B|^2 alone overestimates |G|^2 by tr(Sigma)/B: combine both norms)")
    if label == "tr(Sigma)" and np.isclose(got, b * (np.mean(local) - averaged)):
        return _(
            " (that treats the averaged gradient as the true one; it too has noise, "
            "tr(Sigma)/B with B = N b = {big})"
        ).format(big=big)
    if label == "|G|^2" and np.isclose(got, np.mean(local)):
        return _(" (the ranks' own norms overestimate |G|^2 most, by tr(Sigma)/b)")
    return _(" (use E|G_b|^2 = |G|^2 + tr(Sigma)/b at both batch sizes b and B = N b)")


def check_noise_estimates(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 12.2: ``fn(local_sq_norms, averaged_sq_norm, local_batch) -> (|G|^2, tr(Sigma))``."""
    return run_check("12.2", "noise-scale estimates", lambda: _noise_body(fn), verbose=verbose)


# ---- Exercise 12.3: one LARS step ---------------------------------------------------------------
def _lars_cases() -> list[tuple[str, dict]]:
    rng = np.random.default_rng(3)
    cases = []
    for name, shape, w_scale, g_scale, decay, momentum in (
        (N_("a weight matrix, no decay"), (6, 4), 1.0, 0.01, 0.0, 0.0),
        (N_("a bias initialised at zero"), (4,), 0.0, 1.0, 0.0, 0.9),
        (N_("a large layer with a tiny gradient"), (3, 5), 30.0, 1e-4, 0.0, 0.9),
        (N_("weight decay 5e-4 with momentum"), (5, 5), 1.0, 0.1, 5e-4, 0.9),
        (N_("strong weight decay"), (7,), 2.0, 0.5, 0.1, 0.5),
    ):
        cases.append(
            (
                name,
                {
                    "w": rng.normal(size=shape) * w_scale,
                    "g": rng.normal(size=shape) * g_scale,
                    "v": rng.normal(size=shape) * 1e-3 * (momentum > 0),
                    "lr": 4.0,
                    "momentum": momentum,
                    "weight_decay": decay,
                    "eta": 0.001,
                },
            )
        )
    return cases


def _library_lars(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """One step of the library's LARS on this one layer, in float64, from velocity ``v``."""
    w = torch.nn.Parameter(torch.from_numpy(case["w"].copy()))
    w.grad = torch.from_numpy(case["g"].copy())
    opt = layerwise.LARS(
        [w],
        lr=case["lr"],
        momentum=case["momentum"],
        weight_decay=case["weight_decay"],
        trust_coefficient=case["eta"],
        exclude_bias_and_norm=False,  # the exercise is the adaptive step of one tensor
    )
    opt.state[w]["velocity"] = torch.from_numpy(case["v"].copy())
    opt.step()
    return w.detach().numpy(), opt.state[w]["velocity"].numpy()


def _lars_body(fn: Callable) -> str:
    cases = _lars_cases()
    expected = [_library_lars(case) for _name, case in cases]
    with _library_refused(fn, [(layerwise.LARS, "step"), (layerwise, "_trust_ratio")]):
        for (label, case), (want_w, want_v) in zip(cases, expected, strict=True):
            name = _(label)
            args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in case.items()}
            w, g, v = args.pop("w"), args.pop("g"), args.pop("v")
            got_w, got_v = (np.asarray(a, dtype=float) for a in fn(w, g, v, **args))
            if got_w.shape != want_w.shape:
                raise AssertionError(
                    _("{name}: new w has shape {got}, want {want}").format(
                        name=name, got=got_w.shape, want=want_w.shape
                    )
                )
            if not np.all(np.isfinite(got_w)):
                raise AssertionError(
                    _(
                        "{name}: the new weights are not finite; where a norm is 0 the trust "
                        "ratio is undefined: the reference implementations take the whole trust "
                        "ratio (eta included) as 1 there"
                    ).format(name=name)
                )
            if not (np.allclose(got_v, want_v, rtol=1e-7, atol=1e-12)
                    and np.allclose(got_w, want_w, rtol=1e-7, atol=1e-12)):  # fmt: skip
                err = float(np.abs(got_w - want_w).max())
                raise AssertionError(
                    _("{name}: new w off by up to {err} ({hint})").format(
                        name=name, err=f"{err:.3g}", hint=_lars_hint(case)
                    )
                )
    return _("{n} layers (a zero bias, a tiny gradient, weight decay), w and v exact").format(
        n=len(cases)
    )


def _lars_hint(case: dict) -> str:
    if not np.any(case["w"]):
        return _(
            "where a norm is 0 the trust ratio is undefined: the reference implementations "
            "(TensorFlow's, Apex's) take the whole trust ratio, eta included, as 1 there"
        )
    if case["weight_decay"]:
        return _(
            "with weight decay the local lr is eta ||w|| / (||g|| + beta ||w||), applied to "
            "g + beta w"
        )
    return _(
        "the local lr is eta ||w|| / ||g||; the velocity is momentum v + lr * local lr * g, "
        "and w moves by -v"
    )


def check_lars_update(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 12.3: ``fn(w, g, v, lr=, momentum=, weight_decay=, eta=) -> (new w, new v)``."""
    return run_check("12.3", "LARS step", lambda: _lars_body(fn), verbose=verbose)
