"""Lecture 11's gradient accumulation as a memory tool: k micro-batches keep 1/k of the activations
and give the big batch's gradient (float rounding only); DDP's ``no_sync`` gives the same weights
as one big-batch step with k times fewer exchanges (two real processes on gloo).

Tolerance: the accumulated gradient adds k weighted micro-batch means where one pass takes one
mean, so the two differ by float32 rounding, ~1e-7 relative; we allow 1e-6.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from course_lib.parallel.sharded.accumulation import accumulate_gradients, accumulation_memory
from course_lib.training.models import MLP

B, D, HIDDEN, CLASSES = 48, 64, (48, 40, 24), 10
RTOL = 1e-6


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return MLP(D, HIDDEN)


def batch(n: int = B, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_k_micro_batches_keep_one_kth_of_the_activations_and_the_same_gradient(k):
    got = accumulation_memory(mlp(), *batch(), k)
    # Linear saves its input, ReLU its output: 4 bytes x samples x (D + sum of hidden widths)
    assert got["batch_bytes"] == 4 * B * (D + sum(HIDDEN))
    assert got["accumulated_bytes"] == 4 * (B // k) * (D + sum(HIDDEN))
    assert got["grad_difference"] <= RTOL


def test_uneven_micro_batches_are_weighted_by_their_size():
    net, (x, y) = mlp(), batch()
    got = accumulation_memory(net, x, y, 5)  # 48 = 10 + 10 + 10 + 9 + 9
    assert got["accumulated_bytes"] == 4 * 10 * (D + sum(HIDDEN))
    assert got["grad_difference"] <= RTOL
    # the big batch's mean loss, not the sum of 5 means (which would give 5x the gradient)
    net.zero_grad()
    loss = accumulate_gradients(net, x, y, 5)["loss"]
    assert loss == pytest.approx(nn.functional.cross_entropy(net(x), y).item(), rel=1e-6)


def test_unweighted_micro_batch_losses_would_be_caught():
    # What the check above guards against: summing k micro-batch means gives k x the gradient.
    net, (x, y) = mlp(), batch()
    accumulate_gradients(net, x, y, 1)
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    for xs, ys in zip(x.chunk(4), y.chunk(4), strict=True):
        nn.functional.cross_entropy(net(xs), ys).backward()
    assert not torch.allclose(next(net.parameters()).grad, want[0], rtol=1e-3)


def test_a_bad_micro_batch_count_names_the_fix():
    with pytest.raises(ValueError, match=r"k=0 .* choose 1 <= k <= 48"):
        accumulate_gradients(mlp(), *batch(), 0)
    with pytest.raises(ValueError, match=r"k=49 micro-batches of a batch of 48"):
        accumulate_gradients(mlp(), *batch(), 49)


# ---- DDP's no_sync on two gloo processes ------------------------------------------------------
N, K, STEPS, LR = 2, 4, 3, 0.1


def _ddp_worker(rank: int, folder: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=N)
    try:
        out = {}
        for label, no_sync in (("no_sync", True), ("sync_each", False)):
            net = mlp()
            single = copy.deepcopy(net)
            model = DDP(net)
            calls = [0]

            def counting(state, bucket, calls=calls):
                calls[0] += 1
                return allreduce_hook(None, bucket)

            model.register_comm_hook(None, counting)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            ref_opt = torch.optim.SGD(single.parameters(), lr=LR)
            peaks = []
            for step in range(STEPS):
                x, y = batch(N * B, seed=10 + step)  # the global batch; this rank's half
                opt.zero_grad()
                peaks.append(
                    accumulate_gradients(
                        model,
                        x[rank * B : (rank + 1) * B],
                        y[rank * B : (rank + 1) * B],
                        K,
                        no_sync=no_sync,
                    )["peak_activation_bytes"]
                )
                opt.step()
                ref_opt.zero_grad()
                nn.functional.cross_entropy(single(x), y).backward()  # one process, big batch
                ref_opt.step()
            error = max(
                float((a - b).abs().max() / b.abs().max())
                for a, b in zip(net.parameters(), single.parameters(), strict=True)
            )
            out[label] = {"calls": calls[0], "error": error, "peak": max(peaks)}
            del model  # DDP's reducer and its hook go before the process group does
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
        # Both ranks past every collective before the group is torn down: a fresh clone's run
        # saw one rank abort in teardown ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_ddp_no_sync_gives_the_big_batch_weights_with_k_times_fewer_exchanges(tmp_path):
    mp.spawn(_ddp_worker, args=(str(tmp_path),), nprocs=N, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(N)]
    for out in ranks:
        for label in ("no_sync", "sync_each"):
            assert out[label]["error"] <= RTOL, (label, out[label]["error"])
            assert out[label]["peak"] == 4 * (B // K) * (D + sum(HIDDEN))
        # a small model is one bucket: one allreduce per synced backward
        assert out["no_sync"]["calls"] == STEPS
        assert out["sync_each"]["calls"] == K * STEPS
