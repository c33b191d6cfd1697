"""Lecture 4: Checkpoint and resume of a data-parallel run: which methods allow it, and the notebook's checks.

The engines follow the contract of :mod:`course_lib.checkpoint` through ``training.loop.fit(...,
comm=...)``: one file per position, written atomically by rank 0 (its replica, the optimiser
state, the history and every rank's random streams and sampler, gathered to it); on resume
every rank reads the same file. Rank 0's replica stands for all of them only when the replicas
are equal after every step and the method keeps nothing between steps: true of the methods that
average gradients every step with no memory (``GradientExchange.checkpointable``; the class
says why not in ``not_checkpointable_because``). The others are refused, not half saved:

* Local-SGD and gossip: the replicas differ between averagings (that is the method), so rank 0's
  weights are not the run's; saving every replica would be needed, and their optimisers too.
* compressed (and DDP with a compression hook): error feedback keeps each rank's residual (what
  compression dropped, to be sent later), and stochastic compressors draw from their own streams.
* ddp: PyTorch's wrapper holds the model under ``module.``; use ``builtin`` or ``bucketed``, the
  same averaging without the wrapper, when a run must be resumable.

The folder must be one that every engine can read (rank 0 writes it; on one PC any folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from course_lib.checkpoint import CheckpointConfig, CheckpointError, load_checkpoint
from course_lib.checkpoint.state import sharding_mismatch
from course_lib.parallel.exchanges.base import GradientExchange
from course_lib.parallel.exchanges.registry import EXCHANGES

__all__ = ["checkpointable_methods", "prepare_checkpointing"]


def checkpointable_methods() -> list[str]:
    """Return the registered methods whose runs can be saved and resumed, sorted by name."""
    return sorted(name for name, cls in EXCHANGES.items() if cls.checkpointable)


def prepare_checkpointing(
    method: GradientExchange,
    checkpoint: CheckpointConfig | str | os.PathLike | None,
    resume_from: str | os.PathLike | None,
    world_size: int,
) -> tuple[CheckpointConfig | None, str | None, tuple[int, int]]:
    """Check a run's checkpoint settings before any engine is busy; raise with the fix.

    Return the checkpoint config, the one file every rank resumes from (a folder's newest,
    chosen once here so that no rank sees another), and its ``(epochs_done, steps_done)``.
    """
    config = CheckpointConfig.of(checkpoint)
    if config is not None and not isinstance(config, CheckpointConfig):
        raise TypeError(f"checkpoint must be a folder or a CheckpointConfig, got {checkpoint!r}")
    if (config is not None or resume_from is not None) and not method.checkpointable:
        name = method.name
        raise ValueError(
            f"method {name!r} cannot be checkpointed: {method.not_checkpointable_because}. "
            f"Checkpoint and resume work with {', '.join(checkpointable_methods())}; run "
            f"{name!r} without checkpoint= and resume_from="
        )
    if resume_from is None:
        return config, None, (0, 0)
    ckpt = load_checkpoint(resume_from, world_size=world_size)  # refuses a bad file or world size
    problem = sharding_mismatch(ckpt, method.optimizer_shards(world_size))
    if problem:  # before any engine is busy
        raise CheckpointError(problem)
    return config, str(Path(ckpt["path"]).resolve()), (ckpt["epochs_done"], ckpt["steps_done"])
