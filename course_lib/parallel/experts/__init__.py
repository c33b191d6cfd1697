"""Lecture 15: Mixture of experts and expert parallelism: top-k gating, capacity, all-to-all dispatch."""

from course_lib.parallel.experts.expert_parallel import AllToAll, ExpertParallelMoE, moe_step_bytes
from course_lib.parallel.experts.gating import Routing, capacity, route
from course_lib.parallel.experts.layer import MoE, combine, dispatch
from course_lib.parallel.experts.train import (
    MoEConfig,
    moe_data,
    train_moe_expert_parallel,
    train_moe_one_process,
    train_skewed_router,
)

__all__ = [
    "AllToAll",
    "ExpertParallelMoE",
    "MoE",
    "MoEConfig",
    "Routing",
    "capacity",
    "combine",
    "dispatch",
    "moe_data",
    "moe_step_bytes",
    "route",
    "train_moe_expert_parallel",
    "train_moe_one_process",
    "train_skewed_router",
]
