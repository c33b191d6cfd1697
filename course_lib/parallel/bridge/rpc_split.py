"""Lecture 15: ``torch.distributed.rpc`` with distributed autograd: a model split in two across workers.

The one framework of the course's tour that the engines do not use: instead of every rank
running the same program (SPMD), rank 0 drives and calls functions on worker 1 by name
(``rpc.remote`` returns a reference, an ``RRef``, to a module living there). The forward pass
crosses the process boundary; ``dist_autograd.backward`` follows the recorded sends back
across it, and ``DistributedOptimizer`` steps each parameter where it lives. Launch with
``torchrun --standalone --nproc_per_node 2 -m course_lib.parallel.bridge.rpc_split --out DIR``:
rank 0 trains the split MLP 3 Adam steps and the same MLP in one process, and writes the largest
relative difference of their weights. (Horovod and ``tf.distribute`` correspond to the kit's
data parallelism: an allreduce of gradients, :mod:`course_lib.parallel.exchanges`.)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch import nn

__all__ = ["Stage", "main", "train_split"]


class Stage(nn.Module):
    """One half of the MLP, built on the worker that holds it from the shared seed."""

    def __init__(self, half: int) -> None:
        super().__init__()
        self.net = _full()[half]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def parameter_rrefs(self) -> list:
        """Return RRefs to this stage's parameters, for the DistributedOptimizer."""
        from torch.distributed.rpc import RRef

        return [RRef(p) for p in self.parameters()]


def _full() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(
        [nn.Sequential(nn.Linear(6, 12), nn.Tanh()), nn.Sequential(nn.Linear(12, 3))]
    )


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def train_split(steps: int) -> dict[str, torch.Tensor]:
    """On rank 0: train stage 0 here and stage 1 on worker1 over RPC; return every weight."""
    import torch.distributed.autograd as dist_autograd
    from torch.distributed import rpc
    from torch.distributed.optim import DistributedOptimizer

    first = rpc.remote("worker0", Stage, args=(0,))
    second = rpc.remote("worker1", Stage, args=(1,))
    params = first.rpc_sync().parameter_rrefs() + second.rpc_sync().parameter_rrefs()
    opt = DistributedOptimizer(torch.optim.Adam, params, lr=1e-2)
    for step in range(steps):
        X, Y = _data(step)
        with dist_autograd.context() as ctx:
            h = first.rpc_sync().forward(X)
            y = second.rpc_sync().forward(h)  # h travels to worker1, y comes back
            loss = nn.functional.mse_loss(y, Y)
            dist_autograd.backward(ctx, [loss])  # gradients flow back across the workers
            opt.step(ctx)
    weights = {}
    for half, ref in ((0, first), (1, second)):
        state = ref.rpc_sync().state_dict()
        weights.update({f"{half}.{k}": v for k, v in state.items()})
    return weights


def train_one_process(steps: int) -> dict[str, torch.Tensor]:
    """The same MLP and steps in one process."""
    halves = _full()
    opt = torch.optim.Adam(halves.parameters(), lr=1e-2)
    for step in range(steps):
        X, Y = _data(step)
        opt.zero_grad()
        nn.functional.mse_loss(halves[1](halves[0](X)), Y).backward()
        opt.step()
    return {f"{h}.net.{k}": v for h in (0, 1) for k, v in halves[h].state_dict().items()}


def main() -> None:
    """Join the RPC world torchrun started; rank 0 trains and writes the comparison to --out."""
    from torch.distributed import rpc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)  # MASTER_ADDR/PORT from torchrun
    if rank == 0:
        split, ref = train_split(args.steps), train_one_process(args.steps)
        worst = max(float((split[k] - v).abs().max() / v.abs().max()) for k, v in ref.items())
        start = {
            f"{h}.net.{k}": v
            for h, half in enumerate(_full())
            for k, v in half.state_dict().items()
        }
        moved = min(float((split[k] - v).abs().max()) for k, v in start.items())  # it trained
        result = {"worst": worst, "moved": moved, "names": sorted(split) == sorted(ref)}
        Path(args.out, "rpc.json").write_text(json.dumps(result))
    rpc.shutdown()  # waits for every worker


if __name__ == "__main__":
    main()
