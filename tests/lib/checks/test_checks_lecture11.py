"""Lecture 11's exercise checks pass the instructor's answers, fail the stubs and name the tempting mistakes."""

from __future__ import annotations

import torch
from lecture11_answers import my_bytes_per_rank, my_shard_update

from course_lib.checks.lecture11 import (
    check_bytes_per_rank,
    check_shard_update,
    stub_bytes_per_rank,
    stub_shard_update,
)
from course_lib.parallel.sharded.ledger import formula_bytes


def test_bytes_per_rank_check():
    assert check_bytes_per_rank(my_bytes_per_rank, verbose=False)
    stub = check_bytes_per_rank(stub_bytes_per_rank, verbose=False)
    assert not stub and "not implemented" in str(stub)


def test_bytes_per_rank_names_the_stage_2_and_master_weight_mistakes():
    def stage_2_keeps_whole_gradients(stage, psi, n, mixed):
        return my_bytes_per_rank(1 if stage == 2 else stage, psi, n, mixed)

    wrong = check_bytes_per_rank(stage_2_keeps_whole_gradients, verbose=False)
    assert not wrong and "stage 2 shards the gradients too" in str(wrong)

    def no_master_weights(stage, psi, n, mixed):
        if not mixed or stage == 0:
            return my_bytes_per_rank(stage, psi, n, mixed)
        return {1: 4 * psi + 8 * psi / n, 2: 2 * psi + 10 * psi / n, 3: 12 * psi / n}[stage]

    wrong = check_bytes_per_rank(no_master_weights, verbose=False)
    assert not wrong and "master copy of the weights: K = 12" in str(wrong)


def test_bytes_per_rank_refuses_the_librarys_formula():
    def delegates(stage, psi, n, mixed):
        return formula_bytes(stage, psi, n)

    refused = check_bytes_per_rank(delegates, verbose=False)
    assert not refused and "calls formula_bytes" in str(refused)

    namespace = {"f": formula_bytes}  # the same function imported under another name
    exec("def renamed(stage, psi, n, mixed):\n    return f(stage, psi, n)", namespace)
    refused = check_bytes_per_rank(namespace["renamed"], verbose=False)
    assert not refused and "calls f (the library's formula)" in str(refused)


def test_shard_update_check():
    assert check_shard_update(my_shard_update, verbose=False)
    stub = check_shard_update(stub_shard_update, verbose=False)
    assert not stub and "not implemented" in str(stub)


def test_shard_update_names_the_sum_and_the_even_split_mistakes():
    def sum_not_mean(weights, grad_sum, rank, n, m, v, step, lr):
        return my_shard_update(weights, grad_sum * n, rank, n, m, v, step, lr)

    wrong = check_shard_update(sum_not_mean, verbose=False)
    assert not wrong and "divide it by N" in str(wrong)

    def even_split(weights, grad_sum, rank, n, m, v, step, lr):
        size = weights.numel() // n  # forgets the remainder: the last values belong to no one
        shard, m, v = my_shard_update(weights, grad_sum, rank, n, m, v, step, lr)
        return shard[:size], m[:size], v[:size]

    wrong = check_shard_update(even_split, verbose=False)
    assert not wrong and "the first numel % N chunks one longer" in str(wrong)

    def no_bias_correction(weights, grad_sum, rank, n, m, v, step, lr):
        g = grad_sum / n
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        shard, _, _ = my_shard_update(weights, grad_sum, rank, n, m * 0, v * 0, 1, 0.0)
        return shard - lr * m / (torch.sqrt(v) + 1e-8), m, v

    wrong = check_shard_update(no_bias_correction, verbose=False)
    assert not wrong and "bias correction" in str(wrong)
