"""Benchmark lecture 11's recomputation: activation memory saved against step time added.

A deep MLP on random digits-shaped inputs (64 inputs, ``--depth`` hidden layers of
``--width``), one forward + backward per run, without checkpoints and with the model cut into
``k`` segments (``torch.utils.checkpoint``). Prints per ``k`` the activation bytes held between
forward and backward (measured with saved-tensor hooks), the fastest step of ``--repeats``, and
both as ratios to the plain run (the time to the plain run timed in turn with it, so that both
see the same load); the gradients are checked equal. One process, one thread.

    .venv/bin/python bench/bench_recomputation.py
    .venv/bin/python bench/bench_recomputation.py --depth 16 --width 1024 --batch 512
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from course_lib.parallel.sharded.activations import recomputation_cost  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402


def main() -> None:
    """Sweep the segment count and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = MLP(64, (args.width,) * args.depth)
    x, y = torch.randn(args.batch, 64), torch.randint(0, 10, (args.batch,))
    modules = len(net)
    print(
        f"MLP 64-{args.width}x{args.depth}-10 ({modules} modules), batch {args.batch}, "
        f"fastest of {args.repeats}"
    )
    print(
        f"{'segments':>8} {'act. MB':>8} {'x plain':>8} {'step ms':>8} {'plain ms':>8} "
        f"{'x plain':>8} same grads"
    )
    plain = None
    for k in sorted({2, 3, 4, max(2, round(args.depth**0.5)), args.depth, modules}):
        cost = recomputation_cost(net, x, y, segments=k, repeats=args.repeats)
        if plain is None:
            plain = cost
            print(f"{'none':>8} {cost['plain_bytes'] / 1e6:>8.2f} {1:>8.2f}")
        # the time ratio is to the plain run timed in turn with this one (the same load)
        print(
            f"{k:>8} {cost['checkpointed_bytes'] / 1e6:>8.2f} "
            f"{cost['checkpointed_bytes'] / plain['plain_bytes']:>8.2f} "
            f"{1e3 * cost['checkpointed_s']:>8.1f} {1e3 * cost['plain_s']:>8.1f} "
            f"{cost['checkpointed_s'] / cost['plain_s']:>8.2f} {cost['grad_difference'] == 0}",
            flush=True,
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
