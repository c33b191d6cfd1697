"""Lecture 15: The bridge to the tools practitioners run: DeviceMesh / DTensor, torch.profiler, torchrun."""

from course_lib.parallel.bridge.device_mesh import compare_mlp
from course_lib.parallel.bridge.device_mesh_block import SplitBlock, compare_block
from course_lib.parallel.bridge.profiler import (
    TraceSummary,
    plot_trace,
    profile_step,
    read_trace,
    summarise,
)

__all__ = [
    "SplitBlock",
    "TraceSummary",
    "compare_block",
    "compare_mlp",
    "plot_trace",
    "profile_step",
    "read_trace",
    "summarise",
]
