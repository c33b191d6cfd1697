"""Lecture 15: Process grids: parallelisms composed on named axes of sub-communicators (a DeviceMesh).

``mesh`` (the grid), ``gpt3d`` (TinyGPT on data x pipeline x tensor), ``equality3d`` (beside one
process, bytes per axis and memory per rank by formula), ``costs3d`` / ``simulate3d`` (lecture
13's simulator on a (dp, tp, pp, cp) grid), ``search3d`` (which grid a model and a room call
for) and ``measure3d`` (grids timed on the engines beside their predictions).
"""

from course_lib.parallel.grid.mesh import ProcessGrid, grid_lines, grid_shape

__all__ = ["ProcessGrid", "grid_lines", "grid_shape"]
