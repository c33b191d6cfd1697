"""What the engine side of A6's checks shares: the counters, the ranks' agreement, the tolerance.

Every engine rebuilds the same inputs from a fixed seed and computes the one-process reference
itself; the counters of its communicator tell whom it talked to and which collectives it called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TOL", "TRAIN_LR", "TRAIN_STEPS", "agree", "builtins_used", "close", "p2p_traffic"]

TRAIN_STEPS, TRAIN_LR = 3, 0.1
TOL = {"rtol": 1e-4, "atol": 1e-5}


def builtins_used(comm: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} of every built-in collective but the barrier."""
    return {n: (c.calls, c.bytes) for n, c in comm.stats.collectives.items() if n != "barrier"}


def p2p_traffic(comm: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    return {
        p: (s.messages_sent, s.bytes_sent, s.messages_received, s.bytes_received)
        for p, s in sorted(comm.stats.peers.items())
        if s.messages_sent or s.messages_received
    }


def agree(comm: Any, why: str) -> str:
    """Return ``why``, or a note that another rank failed: every rank stops at the same case."""
    import numpy as np

    failed = comm.allreduce(np.array([1 if why else 0], dtype=np.int64), op="max")
    return why or ("another rank found a problem in this case" if failed[0] else "")


def close(got: Any, want: Any) -> bool:
    """Return whether ``got`` has ``want``'s shape and values (within :data:`TOL`)."""
    import torch

    return got is not None and got.shape == want.shape and torch.allclose(got, want, **TOL)
