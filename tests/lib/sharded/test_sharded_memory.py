"""Lecture 11's activation memory (measured with saved-tensor hooks, against the arithmetic),
recomputation (less memory, the same gradients) and mixed precision (the 16-bytes accounting,
bfloat16 autocast with float32 master weights)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from course_lib.parallel.sharded.activations import activation_memory, recomputation_cost
from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes, train_autocast
from course_lib.training.models import MLP

B, D, HIDDEN = 32, 64, (48, 40, 24)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return MLP(D, HIDDEN)


def test_activation_bytes_are_the_inputs_of_each_linear():
    # Linear saves its input, ReLU its output (the next Linear's input: one tensor, counted once).
    got = activation_memory(mlp(), torch.randn(B, D))
    assert got.total_bytes == 4 * B * (D + sum(HIDDEN))
    assert got.per_module == {"1": 4 * B * D, "2": 4 * B * 48, "4": 4 * B * 40, "6": 4 * B * 24}


def test_recomputation_keeps_less_and_gives_the_same_gradients():
    net, x, y = mlp(), torch.randn(B, D), torch.randint(0, 10, (B,))
    plain = activation_memory(net, x).total_bytes
    # 8 modules in 2 segments of 4: the first keeps only its input (x); the second (ReLU, Linear,
    # ReLU, Linear) is not checkpointed and saves its ReLUs' outputs (40 and 24 wide).
    two = activation_memory(net, x, segments=2)
    assert two.total_bytes == 4 * B * (D + 40 + 24) < plain
    cost = recomputation_cost(net, x, y, segments=2, repeats=1)
    assert cost["grad_difference"] == 0.0
    assert cost["checkpointed_bytes"] < cost["plain_bytes"]


def test_recomputation_refuses_what_it_cannot_cut():
    with pytest.raises(ValueError, match="1..8 segments; got segments=9.*nn.Sequential"):
        activation_memory(mlp(), torch.randn(B, D), segments=9)


@pytest.mark.parametrize("n", [1, 2, 4, 64])
def test_mixed_precision_adam_holds_16_bytes_per_value_like_float32(n):
    psi = 1_000_000
    assert mixed_precision_bytes(0, psi, n) == formula_bytes(0, psi, n) == 16 * psi
    assert mixed_precision_bytes(3, psi, n) == formula_bytes(3, psi, n) == 16 * psi / n
    assert mixed_precision_bytes(1, psi, n) == 4 * psi + 12 * psi / n
    assert mixed_precision_bytes(2, psi, n) == 2 * psi + 14 * psi / n
    # sharding the optimiser state pays most with mixed precision: 12 of the 16 bytes
    assert mixed_precision_bytes(1, psi, n) <= formula_bytes(1, psi, n)


def test_bfloat16_autocast_keeps_float32_master_weights_and_learns_like_float32():
    X, y = torch.randn(256, D), torch.randint(0, 10, (256,))
    run = partial(train_autocast, partial(MLP, D, HIDDEN), X, y, steps=20, batch_size=32)
    fp32, bf16 = run(dtype=None), run(dtype=torch.bfloat16)
    assert fp32["logits_dtype"] == torch.float32 and bf16["logits_dtype"] == torch.bfloat16
    assert bf16["weights_dtype"] == torch.float32
    assert bf16["losses"][0] == pytest.approx(fp32["losses"][0], rel=2e-2)
    assert bf16["losses"] != fp32["losses"]  # really computed in bfloat16
    assert abs(bf16["losses"][-1] - fp32["losses"][-1]) < 0.1 * fp32["losses"][0]


def test_the_decision_procedure_takes_the_first_rung_that_fits_counting_adams_state():
    from course_lib.parallel.sharded.technique import choose_technique

    psi, n, act = 1e9, 8, 2e9  # float32 Adam: DDP 16 GB (weights 4, gradients 4, moments 8) + 2 GB
    assert choose_technique(psi, n, 20e9, act).technique == "DDP"
    assert choose_technique(psi, n, 17e9, act).technique == "ZeRO-1"  # 18 GB with Adam: no DDP
    assert choose_technique(psi, n, 12e9, act).technique == "ZeRO-1"  # 8 + 1 + 2 GB
    assert choose_technique(psi, n, 8e9, act).technique == "ZeRO-2"  # 4 + 1.5 + 2 GB
    assert choose_technique(psi, n, 4.5e9, act).technique == "ZeRO-3 (FSDP)"  # 2 + 2 GB
    # 16 layers: recomputation keeps 2/sqrt(16) of the activations (Chen et al.'s sqrt(n) rule)
    deep = choose_technique(psi, n, 3.1e9, act, layers=16)
    assert deep.technique == "ZeRO-3 + recomputation" and deep.rows[4][1] == 2e9 + 1e9
    choice = choose_technique(psi, n, 1e9, act)
    assert (
        not choice.fits
        and choice.rows[0][:2] == ("DDP", 18e9)
        and "add workers" in choice.sentence()
    )
    assert len(choice.rows) == 5  # no tensor parallelism unless the room has a fast group
    tp = choose_technique(psi, n, 2.6e9, act, layers=16, tensor_parallel=4)
    assert tp.technique.endswith("tensor parallelism") and tp.rows[-1][1] == 2e9 + 0.25e9


def test_the_decision_counts_the_gathered_unit_at_stage_3s_peak():
    from course_lib.parallel.sharded.technique import choose_technique

    # one layer holds most of the model: stage 3's peak gains little over stage 1's
    psi, n = 1e6, 4
    rows = {r[0]: r[1] for r in choose_technique(psi, n, 1e9, 0.0, largest_unit=0.8e6).rows}
    assert rows["ZeRO-3 (FSDP)"] == 16e6 / 4 + 2 * 4 * 0.8e6
    assert rows["ZeRO-3 (FSDP)"] > rows["ZeRO-2"]


def test_the_two_mixed_precision_schemes_are_told_apart():
    from course_lib.parallel.sharded.technique import choose_technique

    psi, n = 1e9, 8
    f32, auto, mixed = (
        {r[0]: r[1:] for r in choose_technique(psi, n, 1e12, 0.0, precision=p).rows}
        for p in ("float32", "autocast", "mixed")
    )
    assert auto == f32  # autocast keeps float32 weights and gradients: 4 + 4 + 8
    assert mixed["ZeRO-1"][0] == 4 * psi + 12 * psi / n < f32["ZeRO-1"][0]  # 2 + 2 + 12
    assert mixed["DDP"][1] == f32["DDP"][1] / 2  # 16-bit gradients on the wire
    with pytest.raises(ValueError, match="use one of float32, autocast, mixed"):
        choose_technique(psi, n, 1e9, 0.0, precision="fp16")


def test_the_transformer_activation_formula_is_korthikantis():
    from course_lib.parallel.sharded.activations import transformer_activation_bytes

    s, b, h, a, n_layers = 2048, 1, 2048, 16, 24  # GPT-3 XL's shapes, one sequence
    fused = transformer_activation_bytes(s, b, h, n_layers)
    assert fused == 34 * s * b * h * n_layers  # 16-bit, no attention probabilities
    textbook = transformer_activation_bytes(s, b, h, n_layers, heads=a)
    assert textbook == s * b * h * (34 + 5 * a * s / h) * n_layers
