"""Lecture 13: Operator costs timed on the engines themselves, as many at once as the strategy computes.

FlexFlow (source 003) times each operator on the device that will run it. Here the devices are
engines sharing a machine's cores: when a strategy splits an operator over k workers, k engines
compute their shards *at the same time*, and on a 2-core machine (more so one shared with other
jobs: Linux gives each session's processes one share of the CPU between them) each gets less of
a core than one engine alone. Shards timed one process at a time (:class:`MeasuredCosts`) then
predict every strategy whose engines compute at once too fast. :class:`EngineCosts` times each
shard in the engines' own conditions: on the engines (their torch threads), after a barrier, on
the first k engines at once, where k is the number of workers its configuration spans (1 for an
operator placed on one worker: one worker, a pipeline stage). The slowest engine's medians are
kept, cached under the machine's description, the place (local engines, a room's PCs) and k.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from course_lib.cost_model.configs import ParallelConfig
from course_lib.cost_model.op_costs import machine_description, shard_signature, time_shard
from course_lib.cost_model.operators import Operator, OperatorGraph
from course_lib.data.paths import cache_dir
from course_lib.files import atomic_write_bytes

__all__ = ["EngineCosts", "time_on_engine"]


def time_on_engine(comm_name: str, jobs: list[tuple[tuple, int]], repeats: int) -> dict[str, Any]:
    """Time every ``(signature, at_once)`` job on this engine; every engine calls it.

    For each job all engines meet at a barrier, then ranks below ``at_once`` time the shard
    together (the others wait at the next barrier). Returns this engine's torch threads and
    its (forward, backward) medians per job (None where it sat out).
    """
    import torch
    from IPython import get_ipython

    comm = get_ipython().user_ns[comm_name]
    threads, times = torch.get_num_threads(), []
    for signature, at_once in jobs:
        comm.barrier()
        times.append(time_shard(signature, repeats, threads) if comm.rank < at_once else None)
    comm.barrier()
    return {"threads": threads, "times": times}


class EngineCosts:
    """Forward and backward seconds of each operator shard, timed on the engines (see module).

    ``place`` names where the engines run (``"local engines"``, ``"room 1gbit"``): it joins the
    machine's description in the cache key (``datasets/cache/engine_op_costs.json``), with the
    engines' torch threads and count. Call :meth:`measure` before asking for a cost.
    """

    def __init__(self, place: str, path: str | os.PathLike | None = None, repeats: int = 7) -> None:
        if repeats < 1 or not place:
            raise ValueError(f"need a place and repeats >= 1, got {place!r}, {repeats}")
        self.path = Path(path) if path else cache_dir() / "engine_op_costs.json"
        self.place, self.repeats, self.machine, self.measured = place, repeats, None, 0
        self._table = json.loads(self.path.read_text()) if self.path.exists() else {}

    @staticmethod
    def _key(op: Operator, cfg: ParallelConfig, batch: int) -> str:
        return repr((shard_signature(op, cfg, batch), cfg.degree))

    def measure(
        self,
        cluster,
        comm_name: str,
        graph: OperatorGraph,
        strategies,
        *,
        refresh: bool = False,
        timeout: float = 600.0,
    ) -> int:
        """Time on ``cluster``'s engines every shard the ``strategies`` (configuration tuples of
        ``graph``) need and the cache lacks (all of them with ``refresh``); return how many."""
        n = cluster.world_size
        probe = cluster.run(time_on_engine, comm_name, [], 1, timeout=timeout)[0]
        self.machine = (
            f"{machine_description(probe['threads'])} on {n} engines ({self.place}), "
            "k shards timed at once, min of repeats"
        )
        mine = self._table.setdefault(self.machine, {})
        jobs, keys = [], []
        for strategy in strategies:
            for op, cfg in zip(graph.ops, strategy, strict=True):
                key = self._key(op, cfg, graph.batch)
                if op.kind == "flatten" or key in keys or (key in mine and not refresh):
                    continue
                if cfg.degree > n:
                    raise ValueError(f"{cfg} spans {cfg.degree} workers; the cluster has {n}")
                keys.append(key)
                jobs.append((shard_signature(op, cfg, graph.batch), cfg.degree))
        if not jobs:
            return 0
        runs = cluster.run(time_on_engine, comm_name, jobs, self.repeats, timeout=timeout)
        for j, key in enumerate(keys):
            timed = [r["times"][j] for r in runs if r["times"][j] is not None]
            mine[key] = [max(t[0] for t in timed), max(t[1] for t in timed)]  # slowest engine
        self.measured += len(jobs)
        atomic_write_bytes(self.path, json.dumps(self._table, indent=1).encode())
        return len(jobs)

    def __call__(self, op: Operator, cfg: ParallelConfig, batch: int) -> tuple[float, float]:
        """Return (forward, backward) seconds of one worker's shard of ``op`` under ``cfg``."""
        if op.kind == "flatten":
            return 0.0, 0.0  # a view: no arithmetic, nothing to time
        if self.machine is None:
            raise RuntimeError("no engine costs yet: call measure(cluster, ...) first")
        key = self._key(op, cfg, batch)
        mine = self._table.get(self.machine, {})
        if key not in mine:
            raise KeyError(f"{key} was not timed on the engines: pass its strategy to measure()")
        fwd, bwd = mine[key]
        return float(fwd), float(bwd)
