"""Instructor answers to lecture 9's exercises (notebooks/09_model_parallel.ipynb)."""

from __future__ import annotations

from typing import Any

__all__ = ["my_column_parallel", "my_features_grad", "my_row_parallel"]


def my_column_parallel(comm: Any, X: Any, W_shard: Any) -> Any:
    """Exercise 9.1: this rank's output columns, gathered from every rank side by side."""
    import torch

    parts = comm.allgather((X @ W_shard.T).contiguous())  # (P, batch, k)
    return torch.cat(list(parts), dim=-1)


def my_row_parallel(comm: Any, X_shard: Any, W_shard: Any) -> Any:
    """Exercise 9.2: the partial product of this rank's columns, summed over ranks."""
    partial = (X_shard @ W_shard.T).contiguous()
    comm.allreduce(partial)
    return partial


def my_features_grad(comm: Any, grad_whole: Any) -> Any:
    """Exercise 9.3: one reduce-scatter; chunk r is the sum of rank r's rows."""
    chunk = comm.reduce_scatter(grad_whole.contiguous())
    return chunk.reshape(-1, *grad_whole.shape[1:])
