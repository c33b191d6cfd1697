"""Lecture 15: Process grids: parallelisms composed on named axes of sub-communicators (a DeviceMesh)."""

from course_lib.parallel.grid.mesh import ProcessGrid, grid_lines, grid_shape

__all__ = ["ProcessGrid", "grid_lines", "grid_shape"]
