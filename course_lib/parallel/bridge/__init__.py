"""Lecture 15: The bridge to the tools practitioners run: DeviceMesh / DTensor, torch.profiler, torchrun."""

from course_lib.parallel.bridge.device_mesh import compare_mlp
from course_lib.parallel.bridge.profiler import (
    TraceSummary,
    plot_trace,
    profile_step,
    read_trace,
    summarise,
)

__all__ = ["TraceSummary", "compare_mlp", "plot_trace", "profile_step", "read_trace", "summarise"]
