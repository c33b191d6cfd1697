"""Lecture 15: The same expert-parallel training launched by ``torchrun`` instead of engines.

``torchrun --nproc_per_node 2 -m course_lib.parallel.bridge.torchrun_moe --out DIR`` starts two
processes with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, and (its
default static rendezvous) a store its agent already serves on that port, which the ranks join
as clients. Each rank builds the kit's gloo communicator from those variables
(:func:`communicator_from_torchrun`), trains the mixture of experts 3 Adam steps exactly as the
engines do, and writes ``rank{r}.json`` with its largest relative difference from one process:
the launcher changes, the training does not.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["communicator_from_torchrun", "main"]


def communicator_from_torchrun(timeout: float = 60.0) -> Any:
    """Return the kit's gloo communicator for a process that ``torchrun`` started."""
    import torch.distributed as dist

    from course_lib.comm import make_communicator

    missing = [
        v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"{missing} not set: start this with torchrun, e.g. torchrun --nproc_per_node 2 -m ..."
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        # torchrun's agent serves the store on MASTER_PORT already: every rank joins as a client
        store = dist.TCPStore(
            addr, port, world, is_master=False, timeout=timedelta(seconds=timeout)
        )
    return make_communicator("gloo", rank, world, addr, port, timeout=timeout, store=store)


def main() -> None:
    """Train the MoE expert-parallel on the torchrun world; write this rank's result to --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for rank{r}.json")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from course_lib.parallel.experts import (
        MoEConfig,
        train_moe_expert_parallel,
        train_moe_one_process,
    )

    comm = communicator_from_torchrun()
    cfg = MoEConfig(num_experts=2 * comm.world_size)
    mine = train_moe_expert_parallel(comm, cfg, args.steps)
    ref = train_moe_one_process(cfg, comm.world_size, args.steps)
    worst = max(
        float(np.abs(w - ref["weights"][n]).max() / np.abs(ref["weights"][n]).max())
        for n, w in mine["weights"].items()
    )
    result = {"rank": comm.rank, "world_size": comm.world_size, "worst": worst,
              "dropped_equal": [d[comm.rank] for d in ref["dropped"]] == mine["dropped"]}  # fmt: skip
    Path(args.out, f"rank{comm.rank}.json").write_text(json.dumps(result))
    comm.barrier()


if __name__ == "__main__":
    main()
