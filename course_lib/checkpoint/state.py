"""Lectures 1 and 4: The training state in a checkpoint: each rank's random streams and sampler, and the run's.

:func:`rank_state` / :func:`restore_rank_state` are what every rank of a data-parallel loop
saves and restores; :func:`save_run` / :func:`resume_run` / :func:`skip_done_steps` are what
``training.loop.fit`` (one process) calls. See :mod:`course_lib.checkpoint` for the contract.

Kept whole: one checkpoint format; a rank's state and the run's are saved and restored together.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.checkpoint.files import (
    FORMAT,
    CheckpointConfig,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "SAME_SETTINGS",
    "gather_rank_states",
    "make_checkpoint",
    "rank_state",
    "rank_state_for",
    "restore_rank_state",
    "restore_streams",
    "restore_training_state",
    "resume_run",
    "run_settings",
    "save_run",
    "sharding_mismatch",
    "skip_done_steps",
]

#: Settings that must match for a resumed run to continue the same run (num_epochs may grow).
#: The schedules (lecture 12) are kept as their ``repr``: a resumed run under another warm-up or
#: ramp-up would take other steps from the same weights.
SAME_SETTINGS = (
    "lr",
    "batch_size",
    "momentum",
    "optimizer",
    "seed",
    "lr_schedule",
    "batch_schedule",
)
SCHEDULES = ("lr_schedule", "batch_schedule")


def rank_state(
    generator: torch.Generator,
    sampler: Any = None,
    *,
    seen: int = 0,
    total_loss: float = 0.0,
) -> dict[str, Any]:
    """Return this process's random streams, sampler state and running loss (nothing modified).

    ``generator`` is the DataLoader's; pass its state at the start of the current epoch when
    saving mid-epoch (a resumed run replays the epoch's order from it and skips the done steps).
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    sampler_state = (
        sampler.state_dict() if hasattr(sampler, "state_dict") else {"type": type(sampler).__name__}
    )
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "loader": generator.get_state() if isinstance(generator, torch.Generator) else generator,
        "sampler": sampler_state,
        "seen": seen,
        "total_loss": total_loss,
    }


def gather_rank_states(comm: Any, state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Return every rank's ``state`` on rank 0 (rank order), None elsewhere; every rank calls it.

    Each state is serialised (``torch.save``), its length allgathered, and sent to rank 0.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    mine = np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()
    lengths = comm.allgather(np.array([mine.size], dtype=np.int64)).reshape(-1)
    if comm.rank != 0:
        comm.send(mine, 0)
        return None
    states = [state]
    for src in range(1, comm.world_size):
        data = comm.recv(np.empty(int(lengths[src]), dtype=np.uint8), src)
        states.append(torch.load(io.BytesIO(data.tobytes()), weights_only=True))
    return states


def rank_state_for(ckpt: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
    """Return rank ``rank``'s saved state, or None when the world size changed (re-seed then).

    Call on a checkpoint that ``load_checkpoint(path, world_size=world_size)`` accepted: a new
    world size is then at an epoch boundary, where each rank builds a fresh ShardSampler.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if ckpt["world_size"] != world_size:
        if ckpt["steps_done"] != 0:  # load_checkpoint refuses this; a hand-made dict may not
            raise CheckpointError("a new world size can resume only from an epoch boundary")
        return None
    return ckpt["ranks"][rank]


def restore_streams(state: dict[str, Any]) -> None:
    """Set the global random streams (Python, NumPy, torch CPU and CUDA) to ``state``."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rank_state(state: dict[str, Any], generator: torch.Generator, sampler: Any) -> None:
    """Set every random stream, ``generator`` and ``sampler`` to ``state`` (from rank_state)."""
    if hasattr(sampler, "load_state_dict"):
        try:
            sampler.load_state_dict(state["sampler"])  # raises on another world size or shard
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    elif state["sampler"].get("type") != type(sampler).__name__:
        raise CheckpointError(
            f"the checkpoint was saved with sampler {state['sampler'].get('type')}, this run "
            f"uses {type(sampler).__name__}: resume with the same sampler"
        )
    restore_streams(state)
    generator.set_state(state["loader"])


def run_settings(config: Any, world_size: int = 1) -> dict[str, Any]:
    """Return the settings a resumed run must share (``SAME_SETTINGS``), batch size global.

    Each rank of a data-parallel run trains on ``batch_size`` = global batch / world size; the
    run's batch is the global one, the same on any world size.
    """
    settings = {name: getattr(config, name, None) for name in SAME_SETTINGS}
    settings["batch_size"] *= world_size
    for name in SCHEDULES:  # plain text: a checkpoint loads with weights_only (no classes)
        settings[name] = None if settings[name] is None else repr(settings[name])
    return settings


def make_checkpoint(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    history: Any,
    *,
    epochs_done: int,
    steps_done: int,
    ranks: list[dict[str, Any]],
    model: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Return the checkpoint of a run after ``epochs_done`` epochs and ``steps_done`` more steps.

    A sharded optimiser (ZeRO, ``optimizer.course_shards``) is kept per rank, in ``ranks``;
    ``"sharded"`` says how it was cut, and ``"optimizer"`` is then None. ``model``: the whole
    weights where ``net`` does not hold them (ZeRO stage 3, gathered by every rank).
    """
    shards = getattr(optimizer, "course_shards", None)
    return {
        "format": FORMAT,
        "epochs_done": epochs_done,
        "steps_done": steps_done,
        "world_size": len(ranks),
        "model": model
        if model is not None
        else {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        "optimizer": None if shards else optimizer.state_dict(),
        "sharded": dict(shards) if shards else None,
        "config": run_settings(config, len(ranks)),
        "history": {"epochs": list(history.epochs), "step_times": list(history.step_times)},
        "ranks": ranks,
    }


def save_run(
    where: CheckpointConfig | str | os.PathLike,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    history: Any,
    *,
    epochs_done: int,
    steps_done: int,
    loader: torch.Generator | torch.Tensor,
    sampler: Any,
    seen: int = 0,
    total_loss: float = 0.0,
    comm: Any = None,
) -> Path | None:
    """Save a run (fit's checkpoint); ``loader``: the generator at the epoch's start.

    With ``comm`` (one rank of a data-parallel run) every rank's state and train history is
    gathered and rank 0 alone writes; the other ranks return None.
    """
    state = rank_state(loader, sampler, seen=seen, total_loss=total_loss)
    shards = getattr(optimizer, "course_shards", None)
    if shards:  # ZeRO: every rank keeps its own shard of the optimiser state
        state["optimizer_shard"] = optimizer.state_dict()
    whole = getattr(optimizer, "course_whole_weights", None)
    model = None
    if whole is not None:  # stage 3: no rank holds the weights; every rank gathers them here
        model = whole()
        state["weight_shards"] = [
            p.detach().clone() for group in optimizer.param_groups for p in group["params"]
        ]
    if comm is None:
        ranks = [state]
    else:  # each rank's train metrics are measured on its own shard: keep its history too
        state["history"] = {"epochs": list(history.epochs)}
        ranks = gather_rank_states(comm, state)
        if ranks is None:
            return None
    checkpoint = make_checkpoint(
        net,
        optimizer,
        config,
        history,
        epochs_done=epochs_done,
        steps_done=steps_done,
        ranks=ranks,
        model=model,
    )
    return save_checkpoint(where, checkpoint)


def restore_training_state(
    ckpt: dict[str, Any],
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    world_size: int = 1,
    rank: int = 0,
) -> None:
    """Load weights and optimiser state from ``ckpt`` after checking the run's settings match.

    ``world_size``: the ranks resuming, each with ``config`` (its batch: global / world size);
    ``rank``: this one (a sharded optimiser loads its own shard).
    """
    shard_problem = sharding_mismatch(ckpt, getattr(optimizer, "course_shards", None))
    if shard_problem:
        raise CheckpointError(shard_problem)
    here = run_settings(config, world_size)
    differ = [
        f"{name}={ckpt['config'].get(name)!r} there, {here[name]!r} here"
        for name in SAME_SETTINGS
        if ckpt["config"].get(name) != here[name]  # .get: files from before the schedules
    ]
    if differ:
        raise CheckpointError(
            f"checkpoint {ckpt['path']} belongs to a run with other settings ({'; '.join(differ)})"
            f": resume with the same TrainConfig (only num_epochs and target may change)"
        )
    saved_shards = (ckpt["ranks"][rank] or {}).get("weight_shards") if ckpt.get("sharded") else None
    with torch.no_grad():
        if saved_shards is not None:  # stage 3: this rank's weights are its shards
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for param, saved in zip(params, saved_shards, strict=True):
                param.copy_(saved)
        else:
            net.load_state_dict(ckpt["model"])  # in place: ZeRO's flat buffers stay the storage
    if ckpt.get("sharded"):
        optimizer.load_state_dict(ckpt["ranks"][rank]["optimizer_shard"])
    else:
        optimizer.load_state_dict(ckpt["optimizer"])


def sharding_mismatch(ckpt: dict[str, Any], here: dict[str, int] | None) -> str:
    """Return "" or why a run whose optimiser is cut as ``here`` cannot resume ``ckpt``.

    ZeRO's optimiser state is saved as one shard per rank, cut for that stage and world size;
    another cut would need the shards re-cut, which is not done here.
    """
    saved = ckpt.get("sharded")
    if saved == here:
        return ""
    where = f"checkpoint {ckpt['path']}"
    if saved and here:
        return (
            f"{where} holds the optimiser state of ZeRO stage {saved['stage']} cut in "
            f"{saved['world_size']} shards, this run is stage {here['stage']} on "
            f"{here['world_size']} ranks: resume with method='zero{saved['stage']}' on "
            f"{saved['world_size']} ranks"
        )
    if saved:
        return (
            f"{where} holds the optimiser state of ZeRO stage {saved['stage']} cut in "
            f"{saved['world_size']} shards: resume with method='zero{saved['stage']}' on "
            f"{saved['world_size']} ranks"
        )
    return (
        f"{where} holds one whole optimiser state, this run shards it (ZeRO stage "
        f"{here['stage']}): resume it with a method that does not shard (e.g. 'ring' or 'zero0')"
    )


def resume_run(
    resume_from: str | os.PathLike,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    generator: torch.Generator,
    sampler: Any,
    history: Any,
    comm: Any = None,
) -> dict[str, Any]:
    """Restore a run from ``resume_from`` in place (fit's resume); return the checkpoint.

    With ``comm``, this process is one rank of a data-parallel run: every rank reads the same
    file; on the world size that saved it each rank restores its own streams and sampler, on
    another one (epoch boundaries only) they stay as at a fresh start.
    """
    rank, world_size = (0, 1) if comm is None else (comm.rank, comm.world_size)
    ckpt = load_checkpoint(resume_from, net=net, world_size=world_size)
    restore_training_state(ckpt, net, optimizer, config, world_size, rank)
    mine = rank_state_for(ckpt, rank, world_size)
    history.epochs[:] = (mine or {}).get("history", ckpt["history"])["epochs"]
    history.step_times[:] = ckpt["history"]["step_times"]
    if mine is not None:
        restore_rank_state(mine, generator, sampler)
    return ckpt


def skip_done_steps(batches: Any, ckpt: dict[str, Any], rank: int = 0) -> tuple[int, int, float]:
    """Consume the batches a mid-epoch checkpoint had trained on; return (steps, seen, loss sum).

    ``batches`` is the epoch's fresh DataLoader iterator, made after :func:`restore_rank_state`
    set the loader's generator to the epoch's start, so it yields the same order as before.
    """
    state = ckpt["ranks"][rank]
    for _ in range(ckpt["steps_done"]):
        next(batches)
    restore_streams(state)  # loading the skipped batches may have drawn random numbers
    return ckpt["steps_done"], state["seen"], state["total_loss"]
