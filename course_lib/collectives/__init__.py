"""Lectures 3-6: Collectives written from point-to-point messages only; each takes a Communicator."""

from course_lib.collectives.all_to_all import (
    all_to_all_naive,
    pairwise_all_to_all,
    pairwise_schedule,
)
from course_lib.collectives.broadcast import broadcast_naive, tree_broadcast
from course_lib.collectives.gossip import gossip_partners, gossip_step, next_distance
from course_lib.collectives.ring import (
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
    ring_schedule,
)
from course_lib.collectives.star import allreduce_naive, star_allreduce
from course_lib.collectives.tree import doubling_schedule, recursive_doubling_allreduce

__all__ = [
    "all_to_all_naive",
    "allreduce_naive",
    "broadcast_naive",
    "doubling_schedule",
    "gossip_partners",
    "gossip_step",
    "next_distance",
    "pairwise_all_to_all",
    "pairwise_schedule",
    "recursive_doubling_allreduce",
    "ring_allgather",
    "ring_allreduce",
    "ring_reduce_scatter",
    "ring_schedule",
    "star_allreduce",
    "tree_broadcast",
]
