"""TinyGPT's 3D step measured on 8 engines beside lecture 15's simulator, for four grids.

On 8 local gloo engines, each grid (data x tensor x pipeline) trains the same TinyGPT; steps
of all grids are timed in interleaved rounds (``course_lib.timing``; a barrier before and after
each step, the slowest rank per round); the pieces' costs at each grid's shapes and the link's
alpha, beta (ping-pong) are measured on the engines, and ``course_lib.parallel.grid.simulate3d``
predicts each grid's step from them. Prints per grid the measured spread, the prediction and
the error, the ranking the measurement supports, and the machine's load. 8 engines on a
2-core machine share its cores: the prediction knows the cores only through the measured costs.

    .venv/bin/python bench/bench_grid3d.py             # 7 rounds
    .venv/bin/python bench/bench_grid3d.py --quick     # 3 rounds
"""

from __future__ import annotations

import argparse
import os

from course_lib.cluster import start_cluster
from course_lib.comm import setup_communicators
from course_lib.parallel.grid.equality3d import GRID_SIZES
from course_lib.parallel.grid.measure3d import measure_grids, prediction_rows
from course_lib.timing import load_line, ranking

GRIDS = [(8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 4, 2)]  # (dp, tp, pp)
BATCH, LENGTH = 16, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    with start_cluster(n=8, seed=0) as cluster:
        setup_communicators(cluster, backend="gloo", timeout=120)
        per_rank = cluster.run(
            measure_grids, "comm", GRIDS, GRID_SIZES, BATCH, LENGTH, 2, rounds, timeout=900
        )
    rows = prediction_rows(per_rank, GRID_SIZES, BATCH, LENGTH, engines_per_core=8 / os.cpu_count())
    for r in rows:
        print(
            f"{r['grid']}: measured {r['measured'].describe()}, predicted "
            f"{1e3 * r['predicted']:.1f} ms, error {100 * r['error']:+.0f} %"
        )
    print("measured:", *ranking({r["grid"]: r["measured"] for r in rows}), sep="\n   ")
    order = sorted(rows, key=lambda r: r["predicted"])
    print("predicted order:", ", ".join(r["grid"] for r in order))
    print(load_line())


if __name__ == "__main__":
    main()
