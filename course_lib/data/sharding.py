"""Lecture 4: Sharding a dataset for data parallelism: rank r of world_size gets its own part of every epoch.

Source 000's algorithm starts with "distribute the training data among the nodes"; source 001
splits the N = M/B mini-batches so that each of P devices gets N/P. Here every rank computes the
same permutation from a shared seed and the epoch number (no communication needed), then takes
every world_size-th index from position rank: the shards are disjoint, their union is the whole
set, and a new epoch reshuffles. This is what ``torch.utils.data.DistributedSampler`` does, minus
its padding: we do not repeat samples, so shard sizes may differ by one (pass ``even=True`` to
drop the remainder instead, when every rank must take the same number of steps).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

__all__ = ["shard_indices", "ShardSampler"]


def _validate(num_samples: int, rank: int, world_size: int) -> None:
    """Raise ValueError with advice for an impossible shard request."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in 0..world_size-1 = 0..{world_size - 1}, got rank={rank}; "
            f"ranks count from 0"
        )
    if world_size > num_samples:
        raise ValueError(
            f"world_size={world_size} is larger than the dataset ({num_samples} samples): some "
            f"ranks would get nothing; use fewer ranks or a larger dataset"
        )


def shard_indices(
    num_samples: int,
    rank: int,
    world_size: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    even: bool = False,
) -> list[int]:
    """Return the sample indices of shard ``rank`` for ``epoch``; the same on every call.

    Every rank must pass the same ``seed``, ``epoch`` and ``num_samples``.
    """
    _validate(num_samples, rank, world_size)
    if shuffle:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(num_samples, generator=generator).tolist()
    else:
        order = list(range(num_samples))
    if even:
        order = order[: num_samples - num_samples % world_size]
    return order[rank::world_size]


class ShardSampler(Sampler[int]):
    """Sampler yielding this rank's shard; call ``set_epoch(epoch)`` before each epoch."""

    def __init__(
        self,
        num_samples: int,
        rank: int,
        world_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        even: bool = False,
    ) -> None:
        _validate(num_samples, rank, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.seed, self.shuffle, self.even = seed, shuffle, even
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration uses."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int | bool | str]:
        """Return the settings and epoch that fix this sampler's order (for a checkpoint)."""
        names = ("num_samples", "rank", "world_size", "seed", "shuffle", "even", "epoch")
        return {"type": type(self).__name__, **{name: getattr(self, name) for name in names}}

    def load_state_dict(self, state: dict[str, int | bool | str]) -> None:
        """Continue from ``state``; raise ValueError if it belongs to another shard or set."""
        mine = self.state_dict()
        differ = [
            f"{k}={state.get(k)!r} there, {v!r} here"
            for k, v in mine.items()
            if k != "epoch" and state.get(k) != v
        ]
        if differ:
            raise ValueError(
                f"the saved sampler state is for another shard ({'; '.join(differ)}): resume "
                f"each rank with ShardSampler({state.get('num_samples')}, rank, "
                f"{state.get('world_size')}, seed={state.get('seed')}), or change the world size "
                f"only at an epoch boundary with a freshly built sampler"
            )
        self.epoch = int(state["epoch"])

    def __iter__(self) -> Iterator[int]:
        return iter(
            shard_indices(
                self.num_samples,
                self.rank,
                self.world_size,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                even=self.even,
            )
        )

    def __len__(self) -> int:
        n = self.num_samples - (self.num_samples % self.world_size if self.even else 0)
        return len(range(self.rank, n, self.world_size))
