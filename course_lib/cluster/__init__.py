"""Lecture 0: Layer 1, the cluster: start, connect to and stop engines; the doctor; recovery; the room.

``start_cluster`` is the one way a notebook gets engines (see :mod:`course_lib.cluster.launch`).
The modules below it never import this package's ``__init__``, so they import each other one
way only: ``launch`` uses ``settings`` and ``course_cluster`` (the cluster it returns), which uses
``doctor``, ``recovery`` and ``engine_side``. Two houses stand apart:
``lab/`` (the instructor's cluster across the room's PCs) and ``room/`` (the emulated room).
"""

from course_lib.cluster.course_cluster import CourseCluster
from course_lib.cluster.launch import connect_cluster, find_mpiexec, start_cluster
from course_lib.cluster.recovery import EngineTimeout
from course_lib.cluster.settings import (
    KINDS,
    ClusterError,
    ClusterSettings,
    default_engine_count,
)

__all__ = [
    "KINDS",
    "ClusterError",
    "ClusterSettings",
    "CourseCluster",
    "EngineTimeout",
    "connect_cluster",
    "default_engine_count",
    "find_mpiexec",
    "start_cluster",
]
