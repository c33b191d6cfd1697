"""Lectures 1 and 4: Checkpoint and resume: the whole training state, written atomically, restored bit for bit.

A checkpoint holds what the next step depends on: the weights, the optimiser's state (momentum
buffers, Adam's moments and step count), every random stream (Python ``random``, NumPy's global
generator, torch's CPU and CUDA generators, the DataLoader's ``torch.Generator``), the position
(epochs done, steps into the next epoch, and that epoch's running loss), the sampler's state and
the :class:`~course_lib.training.loop.History` so far. ``fit(..., checkpoint=folder)`` writes one
after every epoch (and every ``every_steps`` steps); ``fit(..., resume_from=folder_or_file)``
continues so that the weights equal the uninterrupted run's (``torch.equal``) and so does the
history, wall times aside.

**Atomic.** A save writes a temporary file in the checkpoint's folder, flushes and fsyncs it,
renames it into place with ``os.replace`` and fsyncs the folder: the name points at the old
state or the complete new one, never at half a file, also when the process is killed or the
machine loses power mid-save. Write-then-rename alone is atomic; the folder also keeps the last
``keep`` (2) checkpoints, because a file can be complete when written and unusable later —
copied halfway to another lab PC, damaged on disk — and then the previous one is there to
resume from (the error names it). A temporary file left by a killed save starts
with ``.`` and ends ``.partial``; readers ignore it and the next save removes it. Files are
checked on load (a header with the payload's length and SHA-256), so a truncated or corrupt
file, or one from another model or world size, is a :class:`CheckpointError` naming the file
and the fix; loading uses ``torch.load(weights_only=True)``, so a file cannot run code.

**Data parallelism (the contract for a multi-rank loop).** One file per position, written by
rank 0 only: its replica (every replica is equal after each step), the optimiser state, the
history, and ``ranks``, the list of every rank's :func:`rank_state` (its random streams, its
sampler and its running loss), gathered to rank 0. On resume every rank reads the same file,
checks it with ``load_checkpoint(path, net=net, world_size=N)``, loads weights and optimiser
state (``restore_training_state``), and, when ``rank_state_for(ckpt, rank, N)`` returns a state
(same world size), ``restore_rank_state(state, generator, sampler)`` and, mid-epoch,
``skip_done_steps(iter(loader), ckpt, rank)``. ``fit(..., comm=comm)`` on every rank does all of
this (:func:`gather_rank_states` sends the states to rank 0; each rank's state also holds its
history, whose train metrics are measured on its own shard); the checkpoint's ``batch_size`` is
the global batch (per-rank batch x world size), so it matches on any world size.
:mod:`course_lib.parallel.data_parallel.checkpointing` says which exchange methods allow it.

- Same world size: defined anywhere, mid-epoch included; the result is bit for bit the
  uninterrupted run's.
- Different world size: defined only at an epoch boundary (``steps_done == 0``;
  ``load_checkpoint`` refuses otherwise). Weights, optimiser state, epoch and history carry over;
  each rank builds a fresh ``ShardSampler(n, rank, new_world_size, seed=...)`` (its permutation
  depends only on the seed and the epoch) and re-seeds its streams as at a fresh start, since
  rank 3 of 4 has no state in a run of 2. Keeping the *global* batch fixed (per-rank batch =
  global / world size), step t of an epoch averages gradients over the same samples,
  ``perm[t*B:(t+1)*B]``, just split differently: the run equals the uninterrupted one up to
  floating-point summation order (not bit for bit), for models that draw no random numbers while
  training (no dropout; none of the course's models does).
"""

from course_lib.checkpoint.files import (
    CheckpointConfig,
    CheckpointError,
    checkpoint_files,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from course_lib.checkpoint.state import (
    gather_rank_states,
    make_checkpoint,
    rank_state,
    rank_state_for,
    restore_rank_state,
    restore_streams,
    restore_training_state,
    resume_run,
    run_settings,
    save_run,
    skip_done_steps,
)

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "checkpoint_files",
    "gather_rank_states",
    "latest_checkpoint",
    "load_checkpoint",
    "make_checkpoint",
    "rank_state",
    "rank_state_for",
    "restore_rank_state",
    "restore_streams",
    "restore_training_state",
    "resume_run",
    "run_settings",
    "save_checkpoint",
    "save_run",
    "skip_done_steps",
]
