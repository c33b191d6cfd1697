"""Lecture 12: LARS and LAMB against a reference written independently in NumPy from the papers.

The reference works in float64 on a list of arrays, one per layer, with the papers' variable
names (You et al. 2017, Algorithm 1; You et al. 2019, Algorithm 2); the torch optimisers must
give the same weights after several steps on random inputs, within float32 rounding. Chosen
by name in ``TrainConfig``, they train data-parallel runs on real engines like one process.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.reference import (
    max_weight_difference,
    train_one_process,
    weights_match,
)
from course_lib.parallel.data_parallel.replica import GlobalBatchSampler
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.training.layerwise import LAMB, LARS
from course_lib.training.loop import TrainConfig, fit, make_optimizer, seed_everything
from course_lib.training.models import MLP

SHAPES = [(5, 7), (7,), (3, 4, 2), (1,)]
STEPS = 6


def lars_reference(ws, grads, lr, m, beta, eta, exclude=True):
    """You et al. 2017, Algorithm 1, in NumPy, with TensorFlow's LARSOptimizer's conventions: the
    trust ratio is 1 where ||w|| or ||g|| is 0; biases and norms (1-D) take ratio 1, no decay."""
    ws, vs = [w.copy() for w in ws], [np.zeros_like(w) for w in ws]
    for step_grads in grads:
        for layer, g in enumerate(step_grads):
            w = ws[layer]
            wn, gn = np.sqrt(np.sum(w * w)), np.sqrt(np.sum(g * g))
            if exclude and w.ndim <= 1:
                local_lr, decay = 1.0, 0.0
            else:
                local_lr = eta * wn / (gn + beta * wn) if wn > 0 and gn > 0 else 1.0
                decay = beta
            vs[layer] = m * vs[layer] + lr * local_lr * (g + decay * w)
            ws[layer] = w - vs[layer]
    return ws


def lamb_reference(ws, grads, lr, b1, b2, eps, lam, exclude=True):
    """You et al. 2019, Algorithm 2 (phi = identity), in NumPy; ratio 1 where a norm is 0, and
    for excluded biases and norms (1-D: no decay either), as TensorFlow's and Apex's LAMB."""
    ws = [w.copy() for w in ws]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g**2
            m_hat, v_hat = ms[i] / (1 - b1**t), vs[i] / (1 - b2**t)
            r = m_hat / (np.sqrt(v_hat) + eps)
            x = ws[i]
            if exclude and x.ndim <= 1:
                ws[i] = x - lr * r
                continue
            u = r + lam * x
            xn, un = np.linalg.norm(x.ravel()), np.linalg.norm(u.ravel())
            ws[i] = x - lr * (xn / un if xn > 0 and un > 0 else 1.0) * u
    return ws


def _random_problem(seed):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    ws[1][:] = 0  # a bias initialised at zero: its trust ratio is undefined, taken as 1
    ws[2][:] = 0  # a zero matrix (adapted even when biases are excluded): ratio 1 too
    grads = [
        [(rng.normal(size=s) * rng.uniform(0.01, 10)).astype(np.float32) for s in SHAPES]
        for _ in range(STEPS)
    ]
    return ws, grads


def _run_torch(make, ws, grads):
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in ws]
    optimizer = make(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = torch.from_numpy(g.copy())
        optimizer.step()
    return [p.detach().numpy() for p in params]


def _assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("seed, exclude", [(0, True), (1, True), (2, False), (3, False)])
@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 5e-4), (0.0, 0.0), (0.5, 0.1)])
def test_lars_equals_the_numpy_reference(seed, exclude, momentum, weight_decay):
    ws, grads = _random_problem(seed)
    settings = {
        "lr": 2.0,
        "momentum": momentum,
        "weight_decay": weight_decay,
        "trust_coefficient": 0.01,
        "exclude_bias_and_norm": exclude,
    }
    got = _run_torch(lambda p: LARS(p, **settings), ws, grads)
    want = lars_reference(
        [w.astype(np.float64) for w in ws],
        [[g.astype(np.float64) for g in s] for s in grads],
        lr=2.0,
        m=momentum,
        beta=weight_decay,
        eta=0.01,
        exclude=exclude,
    )
    _assert_close(got, want)
    assert not np.allclose(got[0], ws[0], atol=1e-3)  # the weights did move


@pytest.mark.parametrize("seed, exclude", [(0, True), (1, True), (2, False), (3, False)])
@pytest.mark.parametrize("betas, weight_decay", [((0.9, 0.999), 0.01), ((0.5, 0.9), 0.0)])
def test_lamb_equals_the_numpy_reference(seed, exclude, betas, weight_decay):
    ws, grads = _random_problem(seed)
    settings = {"betas": betas, "eps": 1e-6, "weight_decay": weight_decay}
    got = _run_torch(
        lambda p: LAMB(p, lr=0.05, exclude_bias_and_norm=exclude, **settings), ws, grads
    )
    want = lamb_reference(
        [w.astype(np.float64) for w in ws],
        [[g.astype(np.float64) for g in s] for s in grads],
        lr=0.05,
        b1=betas[0],
        b2=betas[1],
        eps=1e-6,
        lam=weight_decay,
        exclude=exclude,
    )
    _assert_close(got, want)
    assert not np.allclose(got[0], ws[0], atol=1e-3)


def test_the_trust_ratio_makes_the_step_relative_to_the_weight():
    """Scaling a layer's weights and gradient by 1000 scales its LAMB step by 1000 too."""
    for scale in (1.0, 1000.0):
        p = torch.nn.Parameter(torch.full((2, 2), scale))  # a matrix: biases are not adapted
        p.grad = torch.tensor([[1.0, -2.0], [3.0, 0.5]]) * scale
        LAMB([p], lr=0.01).step()
        relative = torch.linalg.vector_norm(p.detach() - scale) / (2 * scale)
        assert relative.item() == pytest.approx(0.01, rel=1e-5)  # lr * ||w||, whatever the scale


@pytest.mark.parametrize("exclude", [True, False])
def test_a_zero_initialised_bias_moves_as_under_the_reference_convention(exclude):
    # TensorFlow's LARSOptimizer and Apex's LARC: trust ratio 1 where ||w|| = 0 (and biases
    # excluded from the adaptation): the bias moves by lr * g, not lr * eta * g (1000x less).
    layer = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(layer.bias)
    g = torch.tensor([0.5, -2.0])
    layer.weight.grad, layer.bias.grad = torch.ones(2, 3), g.clone()
    LARS(layer.parameters(), lr=0.1, momentum=0.9, exclude_bias_and_norm=exclude).step()
    torch.testing.assert_close(layer.bias.detach(), -0.1 * g)
    # LAMB: Adam's first step is sign(g) (bias-corrected, eps apart), taken at the global rate
    torch.nn.init.zeros_(layer.bias)
    layer.bias.grad = g.clone()
    LAMB([layer.bias], lr=0.01, exclude_bias_and_norm=exclude).step()
    torch.testing.assert_close(layer.bias.detach(), -0.01 * torch.sign(g), rtol=0, atol=1e-7)


def test_excluded_biases_take_no_weight_decay_and_no_trust_ratio():
    b = torch.nn.Parameter(torch.full((4,), 2.0))
    b.grad = torch.full((4,), 0.1)
    LARS([b], lr=1.0, momentum=0.0, weight_decay=0.5).step()
    torch.testing.assert_close(b.detach(), torch.full((4,), 1.9))  # w - lr g: no eta, no decay
    adapted = torch.nn.Parameter(torch.full((4,), 2.0))
    adapted.grad = torch.full((4,), 0.1)
    LARS([adapted], lr=1.0, momentum=0.0, weight_decay=0.5, exclude_bias_and_norm=False).step()
    # eta ||w|| / (||g|| + beta ||w||) = 0.001 * 4 / (0.2 + 2) applied to g + 0.5 w = 1.1
    torch.testing.assert_close(adapted.detach(), torch.full((4,), 2.0 - 0.004 / 2.2 * 1.1))


def test_a_parameter_without_gradient_is_left_alone():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    a.grad = torch.ones(3)
    for optimizer in (LARS([a, b], lr=1.0), LAMB([a, b], lr=0.1)):
        optimizer.step()
    assert torch.equal(b, torch.ones(3)) and not torch.equal(a, torch.ones(3))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: LARS(p, lr=0.0), "lr must be"),
        (lambda p: LARS(p, lr=1.0, momentum=1.0), "momentum must be in"),
        (lambda p: LARS(p, lr=1.0, weight_decay=-1e-4), "weight_decay must be"),
        (lambda p: LARS(p, lr=1.0, trust_coefficient=0.0), "trust_coefficient.*0.001"),
        (lambda p: LAMB(p, lr=-1.0), "lr must be"),
        (lambda p: LAMB(p, betas=(0.9, 1.0)), r"betas\[1\]"),
        (lambda p: LAMB(p, betas=(0.9,)), "two numbers"),
        (lambda p: LAMB(p, eps=0.0), "eps must be"),
    ],
)
def test_bad_settings_are_refused_with_advice(make, match):
    with pytest.raises(ValueError, match=match):
        make([torch.nn.Parameter(torch.ones(2))])


def test_make_optimizer_builds_lars_and_lamb_by_name():
    net = torch.nn.Linear(3, 2)
    lars = make_optimizer(net, TrainConfig(optimizer="lars", lr=5.0, momentum=0.9))
    lamb = make_optimizer(net, TrainConfig(optimizer="lamb", lr=0.01))
    assert isinstance(lars, LARS) and lars.defaults["momentum"] == 0.9
    assert isinstance(lamb, LAMB) and lamb.defaults["lr"] == 0.01
    with pytest.raises(ValueError, match="'sgd', 'adam', 'lars', 'lamb', got 'lasr'"):
        TrainConfig(optimizer="lasr")


def small_digits() -> TensorDataset:
    """The first 256 training digits: 4 global batches of 64 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:256], y[:256])


def _built_by_hand(config: TrainConfig) -> dict[str, np.ndarray]:
    """One process on whole global batches, its optimiser built here rather than by name."""
    seed_everything(config.seed)
    net, data = MLP(), small_digits()
    if config.optimizer == "lars":
        optimizer = LARS(net.parameters(), lr=config.lr, momentum=config.momentum)
    else:
        optimizer = LAMB(net.parameters(), lr=config.lr)
    sampler = GlobalBatchSampler(len(data), 0, 1, config.batch_size, seed=config.seed)
    fit(net, data, config, sampler=sampler, optimizer=optimizer, progress=False, device="cpu")
    return {name: p.detach().numpy().copy() for name, p in net.named_parameters()}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(num_epochs=2, lr=10.0, batch_size=64, momentum=0.9, optimizer="lars", seed=2),
        TrainConfig(num_epochs=2, lr=0.03, batch_size=64, optimizer="lamb", seed=2),
    ],
    ids=["lars", "lamb"],
)
def test_data_parallel_trains_with_lars_and_lamb_like_one_process(shared_engines, config):
    """2 ranks of 32 with the layer-wise optimiser chosen by name equal one process of 64
    whose optimiser was built by hand (so a name that fell back to SGD would show)."""
    result = train_data_parallel(
        shared_engines(2),
        model=MLP,
        dataset=small_digits,
        config=config,
        method="ring",
        comm_timeout=30,
        timeout=300,
    )
    want = _built_by_hand(config)
    assert result.replicas_equal
    assert weights_match(result.weights, want), max_weight_difference(result.weights, want)
    sgd = train_one_process(MLP, small_digits, replace(config, optimizer="sgd", lr=0.03))
    assert max_weight_difference(sgd, want) > 1e-3  # the layer-wise optimiser changed the run
