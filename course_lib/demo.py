"""The kit's headless main job: start engines, check them, run a live data-parallel demo, print.

Run it with ``./kit demo`` (or ``python -m course_lib.demo --engines 4 --kind mpi``). Every
figure it prints is measured in that run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ipyparallel as ipp
import numpy as np

from course_lib.cluster import CourseCluster, start_cluster

__all__ = [
    "main",
    "round_trip_seconds",
    "softmax_gradient",
    "train_data_parallel",
    "train_single_process",
]


def softmax_gradient(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, int]:
    """Return the summed cross-entropy gradient of a linear softmax model on (X, y), and len(y)."""
    import numpy as np  # runs on engines, where this module's imports may not exist

    logits = X @ W
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1.0
    return X.T @ probs, len(y)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def train_single_process(X: np.ndarray, y: np.ndarray, lr: float, num_steps: int) -> np.ndarray:
    """Full-batch gradient descent in this process: the reference the parallel run must match."""
    W = np.zeros((X.shape[1], 10))
    for _ in range(num_steps):
        grad, count = softmax_gradient(W, X, y)
        W -= lr * grad / count
    return W


def train_data_parallel(
    cluster: CourseCluster, X: np.ndarray, y: np.ndarray, lr: float, num_steps: int
) -> tuple[np.ndarray, list[float]]:
    """Gradient descent with the data split over the engines and the notebook as the server.

    Source 000's scheme: each step the server sends the weights, every worker computes the
    gradient of its shard, and the server combines them. Summing shard gradients and dividing by
    the total count gives exactly the full-batch gradient, so the result equals the
    single-process run up to floating-point rounding.
    """
    cluster.view.scatter("X_shard", X)
    cluster.view.scatter("y_shard", y)
    W = np.zeros((X.shape[1], 10))
    step_seconds = []
    for _ in range(num_steps):
        start = time.perf_counter()
        parts = cluster.view.apply_sync(
            softmax_gradient, W, ipp.Reference("X_shard"), ipp.Reference("y_shard")
        )
        grad = sum(part[0] for part in parts)
        W = W - lr * grad / sum(part[1] for part in parts)
        step_seconds.append(time.perf_counter() - start)
    return W, step_seconds


def round_trip_seconds(cluster: CourseCluster, repeats: int = 30) -> float:
    """Return the median time of a trivial ``%px``-style execute on all engines."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        cluster.view.execute("pass", block=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Run the demo and print what it measured."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=None, help="engine count (default: 2-4)")
    parser.add_argument("--kind", default=None, help="local (default), mpi or connect")
    parser.add_argument("--profile", default=None, help="connect to this running cluster")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with start_cluster(args.kind, args.engines, profile=args.profile) as cluster:
        ready = time.perf_counter() - started
        print(f"Cluster: {cluster.world_size} {cluster.kind} engines ready in {ready:.1f} s\n")
        print(cluster.doctor(), "\n")
        print(
            f"Round trip of a trivial call on all engines: {1e3 * round_trip_seconds(cluster):.2f} ms"
            " (median of 30)\n"
        )
        X, y = _digits()
        lr = 0.5
        W_parallel, step_seconds = train_data_parallel(cluster, X, y, lr, args.steps)
        W_single = train_single_process(X, y, lr, args.steps)
        accuracy = float(((X @ W_parallel).argmax(axis=1) == y).mean())
        print(
            f"Data-parallel gradient descent on digits ({len(y)} images in "
            f"{cluster.world_size} shards), {args.steps} steps:"
        )
        print(
            f"  max |W_parallel - W_single| = {np.abs(W_parallel - W_single).max():.1e}"
            "  (the same model as one process)"
        )
        print(
            f"  train accuracy {accuracy:.3f}; time per step {1e3 * statistics.median(step_seconds):.1f} ms"
            f" (median; weights out and {cluster.world_size} gradients back, "
            f"{2 * W_parallel.nbytes * cluster.world_size / 1e3:.0f} kB a step)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
