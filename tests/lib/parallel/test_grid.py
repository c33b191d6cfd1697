"""Process grids: the lines of ranks along each axis of a row-major grid (no engines; the grid's
sub-communicators train a mixture of experts in tests/lib/experts/test_expert_parallel.py)."""

from __future__ import annotations

import itertools

import pytest

from course_lib.parallel.grid import grid_lines, grid_shape


@pytest.mark.parametrize("dims", [(2, 2), (2, 2, 2), (3, 2), (1, 4), (2, 3, 2)])
def test_lines_along_each_axis_partition_the_ranks_and_vary_one_coordinate(dims):
    import numpy as np

    for axis in range(len(dims)):
        lines = grid_lines(dims, axis)
        assert sorted(itertools.chain(*lines)) == list(range(int(np.prod(dims))))
        for line in lines:
            coords = [np.unravel_index(r, dims) for r in line]
            assert [c[axis] for c in coords] == list(range(dims[axis]))
            others = {tuple(v for i, v in enumerate(c) if i != axis) for c in coords}
            assert len(others) == 1


def test_a_grid_that_does_not_fill_the_world_names_the_fix():
    assert grid_shape({"data": 2, "tensor": 2, "pipeline": 2}, 8) == (2, 2, 2)
    with pytest.raises(ValueError, match="product is 8"):
        grid_shape({"data": 2, "tensor": 3}, 8)
    with pytest.raises(ValueError, match="sizes >= 1"):
        grid_shape({"data": 0}, 8)
