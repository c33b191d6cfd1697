"""float16 with dynamic loss scaling (lecture 11): the scaler decides as PyTorch's GradScaler does,
skipped steps are recorded, and float16 training with float32 master weights matches float32;
bfloat16 weights and gradients with float32 master weights and Adam state hold the 16 bytes per
parameter that ZeRO's K = 12 accounting predicts, counted from the tensors."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.data.digits import load_digits
from course_lib.parallel.sharded.loss_scaling import DynamicLossScaler, train_float16
from course_lib.parallel.sharded.precision import (
    mixed_precision_bytes,
    train_autocast,
    train_mixed_precision,
)
from course_lib.training.models import MLP


def _gradients() -> list[torch.Tensor]:
    """Twelve unscaled gradients; an overflow (inf) or a NaN in steps 0, 1, 5 and 9."""
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, generator=g) for _ in range(12)]
    grads[0][2] = math.inf
    grads[1][0] = -math.inf
    grads[5][4] = math.nan
    grads[9][6] = math.inf
    return grads


SETTINGS = dict(init_scale=2.0**10, growth_interval=3, growth_factor=2.0, backoff_factor=0.5)


def _torch_decisions() -> tuple[list[float], list[int]]:
    """Return GradScaler's scale before every step and the steps it skipped."""
    theirs = torch.amp.GradScaler("cpu", **SETTINGS)
    p = torch.nn.Parameter(torch.zeros(7))
    opt = torch.optim.SGD([p], lr=1.0)
    scales, skips = [], []
    for step, g in enumerate(_gradients()):
        scales.append(theirs.get_scale())
        before = p.detach().clone()
        opt.zero_grad()
        theirs.scale((p * g).sum()).backward()  # p.grad = g * S: the scaled loss's gradient
        theirs.step(opt)
        theirs.update()
        if torch.equal(p.detach(), before):
            skips.append(step)
    return scales, skips


def _decisions(scaler: DynamicLossScaler) -> tuple[list[float], list[int]]:
    """Return ``scaler``'s scale before every step and the steps it skipped."""
    scales = []
    for step, g in enumerate(_gradients()):
        scales.append(scaler.scale)
        _, finite = scaler.unscale([g * scaler.scale])
        scaler.update(finite, step)
    return scales, scaler.skipped


def _mine(cls: type = DynamicLossScaler) -> DynamicLossScaler:
    return cls(
        scale=SETTINGS["init_scale"],
        growth_interval=SETTINGS["growth_interval"],
        growth_factor=SETTINGS["growth_factor"],
        backoff_factor=SETTINGS["backoff_factor"],
    )


def test_the_scaler_decides_as_torchs_grad_scaler():
    """Same gradients, same settings: the same scale before every step and the same skips."""
    scales, skips = _torch_decisions()
    assert _decisions(_mine()) == (scales, skips)
    assert skips == [0, 1, 5, 9]
    assert scales[:6] == [1024.0, 512.0, 256.0, 256.0, 256.0, 512.0]  # halved twice, regrown


def test_a_scaler_that_never_backs_off_disagrees_with_the_reference():
    """The comparison above can fail: a scaler that keeps S on overflow decides otherwise."""

    class Stubborn(DynamicLossScaler):
        def update(self, finite: bool, step: int) -> bool:
            if not finite:
                self.skipped.append(step)
                return False
            return super().update(finite, step)

    assert _decisions(_mine(Stubborn))[0] != _torch_decisions()[0]


@pytest.fixture(scope="module")
def digits():
    return load_digits().tensors, load_digits(train=False).tensors


def test_float16_with_loss_scaling_trains_like_float32_and_shows_its_skips(digits):
    (X, y), test = digits
    run = dict(steps=120, lr=1e-3, seed=3, test=test)
    full = train_autocast(MLP, X, y, dtype=None, **run)
    scaled = train_float16(
        MLP, X, y, scaler=DynamicLossScaler(scale=2.0**24, growth_interval=40), **run
    )
    # Started too large: the first steps overflow, each halves S and leaves the weights alone.
    assert scaled["skipped"][:3] == [0, 1, 2]
    assert scaled["scales"][1] == scaled["scales"][0] / 2
    assert all(w.dtype == torch.float32 for w in scaled["weights"].values())  # the master copy
    assert abs(scaled["accuracy"] - full["accuracy"]) <= 0.02, (
        scaled["accuracy"],
        full["accuracy"],
    )
    plain = train_float16(MLP, X, y, scaler=None, **run)
    assert plain["skipped"] == [] and set(plain["scales"]) == {1.0}


def test_mixed_precision_holds_16_bytes_per_parameter_and_trains_like_float32(digits):
    (X, y), test = digits
    # lr 1e-4: Adam's steps are about 1e-4, below half of bfloat16's spacing (2^-8 relative) for
    # most weights, so only a float32 master copy can accumulate them (Micikevicius et al. 2018).
    run = dict(steps=60, lr=1e-4, test=test)
    full = train_autocast(MLP, X, y, dtype=None, **run)
    mixed = train_mixed_precision(MLP, X, y, **run)
    psi = mixed["psi"]
    assert psi == sum(p.numel() for p in MLP().parameters())
    # Counted from the tensors held after backward: 2 + 2 + (4 + 8) bytes per parameter.
    per_value = {kind: nbytes / psi for kind, nbytes in mixed["held"].items()}
    assert per_value == {
        "16-bit weights": 2,
        "16-bit gradients": 2,
        "float32 master weights": 4,
        "Adam state (m, v)": 8,
    }
    assert sum(mixed["held"].values()) == mixed_precision_bytes(0, psi, 1) == 16 * psi
    assert mixed["update_peak_bytes"] == 20 * psi  # + the float32 gradients, during the update
    # It trains like float32 (the same batches, the same initial weights).
    assert max(abs(a - b) for a, b in zip(mixed["losses"], full["losses"], strict=True)) < 0.01
    assert abs(mixed["accuracy"] - full["accuracy"]) <= 0.01
    # Without master weights: half the bytes, and Adam's small steps are rounded away.
    bare = train_mixed_precision(MLP, X, y, master_weights=False, **run)
    assert sum(bare["held"].values()) == 8 * psi
    assert bare["losses"][-1] - full["losses"][-1] > 0.02  # measured: 0.051 behind after 60 steps


@pytest.mark.parametrize(
    ("settings", "fix"),
    [
        ({"scale": 0.0}, "scale must be a positive finite number"),
        ({"scale": math.inf}, "scale must be a positive finite number"),
        ({"backoff_factor": 2.0}, "0 < backoff_factor < 1"),
    ],
)
def test_bad_scaler_settings_name_the_fix(settings, fix):
    with pytest.raises(ValueError, match=fix):
        DynamicLossScaler(**settings)
