"""Top-k gating and the one-process MoE layer, against a token-by-token loop (no engines)."""

from __future__ import annotations

import pytest
import torch

from course_lib.parallel.experts import MoE, capacity, route


def test_capacity_is_the_ceiling_of_factor_k_tokens_over_experts():
    assert capacity(24, 4, k=2, factor=1.0) == 12
    assert capacity(10, 4, k=1, factor=1.25) == 4  # ceil(3.125)
    with pytest.raises(ValueError, match="1 <= k <= experts"):
        capacity(10, 4, k=5)


def test_first_choices_take_slots_before_second_choices_and_overflow_is_dropped():
    # 4 tokens, 2 experts; every token prefers expert 0, so with 2 slots tokens 2 and 3 lose
    # their first choice, and every second choice (expert 1) fits
    logits = torch.tensor([[3.0, 1.0], [2.0, 0.0], [4.0, 1.0], [1.0, 0.5]])
    r = route(logits, k=2, cap=2)
    assert r.expert[:, 0].tolist() == [0, 0, 0, 0]
    assert r.slot.tolist() == [[0, 0], [1, 1], [-1, -1], [-1, -1]]
    assert r.dropped == 4 and r.wanted.tolist() == [4, 4] and r.kept.tolist() == [2, 2]
    assert torch.allclose(r.gate.sum(1), torch.ones(4))  # top-2 gates renormalised (GShard)
    # the balancing loss: every first choice on expert 0 -> E * P_0 > 1
    assert r.aux_loss.item() == pytest.approx(2 * torch.softmax(logits, 1)[:, 0].mean().item())


def test_uniform_routing_has_balancing_loss_one():
    r = route(torch.zeros(8, 4) + torch.eye(4).repeat(2, 1) * 1e-3, k=1, cap=2)
    assert r.aux_loss.item() == pytest.approx(1.0, abs=1e-3) and r.dropped == 0


@pytest.mark.parametrize("k", [1, 2])
def test_moe_layer_equals_a_loop_over_tokens_dropped_ones_included(k):
    torch.manual_seed(3)
    net = MoE(6, 10, num_experts=4, k=k, capacity_factor=0.75)
    X = torch.randn(16, 6)
    y, aux, routings = net(X, groups=2)
    assert sum(r.dropped for r in routings) > 0  # the case must drop something
    want = torch.zeros_like(y)
    for g, r in enumerate(routings):
        for t in range(8):
            for c in range(k):
                if r.slot[t, c] >= 0:
                    e = int(r.expert[t, c])
                    want[8 * g + t] += r.gate[t, c] * net.experts[e](X[8 * g + t])
    assert torch.allclose(y, want, atol=1e-6)
