"""Lecture 15: The bridge to the tools practitioners run: torch.profiler traces read by code."""

from course_lib.parallel.bridge.profiler import (
    TraceSummary,
    plot_trace,
    profile_step,
    read_trace,
    summarise,
)

__all__ = ["TraceSummary", "plot_trace", "profile_step", "read_trace", "summarise"]
