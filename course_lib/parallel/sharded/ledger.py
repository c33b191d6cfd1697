"""Lecture 11: The memory ledger: bytes of parameters, gradients and optimiser state one rank really holds.

Bytes are counted from the tensors themselves: each distinct storage once (a parameter that
is a view of a flat buffer, or a shard that is a view of it, counts with the buffer; a
stage-3 parameter whose storage was released counts 0). A step's ledger keeps two peaks:

* *settled*: sampled after backward (before the exchange) and after the optimiser step: what
  the formulas count, float32 Adam per rank for ``Psi`` values (ZeRO, Rajbhandari et al.
  2020, with K = 8 bytes of Adam state instead of mixed precision's 12): DDP 16 Psi, stage 1
  8 Psi + 8 Psi/N, stage 2 4 Psi + 12 Psi/N, stage 3 16 Psi/N;
* *in flight*: sampled also inside backward (full-size gradients of a bucket not yet
  reduce-scattered, a stage-3 unit gathered for its layer): the transient part on top.

Beside the model state (``LEDGER_KEYS``, what the formulas count) each step also records
(``EXTRA_KEYS``), each at its own peak:

* ``ledger_activation_bytes``: what autograd saved for backward during the model's forward,
  counted at the end of forward (their peak) by :class:`~.activations.SavedBytes`, the same
  pack hook :func:`~.activations.activation_memory` uses (the loss's own saved tensors, outside
  the model's forward, are not in it);
* ``ledger_comm_bytes``: the exchange's own buffers (a flat gradient buffer, a gathered unit's
  receive buffer) that are not the storage of a parameter, gradient or optimiser state, the
  most held at once; the communicator's internal buffers are not in it;
* ``ledger_rss_bytes``: the process's resident memory (``/proc/self/statm``), the highest seen
  at the ledger's sampling points. What it holds beyond the counted parts is the Python
  interpreter, torch's libraries, the allocator's caches and the communicator's buffers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

import torch

from course_lib.parallel.sharded.activations import SavedBytes

__all__ = [
    "EXTRA_KEYS",
    "LEDGER_KEYS",
    "Ledger",
    "formula_bytes",
    "held_bytes",
    "rss_bytes",
]

LEDGER_KEYS = ("ledger_params_bytes", "ledger_grads_bytes", "ledger_optimizer_bytes")
EXTRA_KEYS = ("ledger_activation_bytes", "ledger_comm_bytes", "ledger_rss_bytes")


def rss_bytes() -> int:
    """Return this process's resident memory in bytes (``/proc/self/statm``, else psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        import psutil

        return int(psutil.Process().memory_info().rss)


def held_bytes(tensors: Iterable[torch.Tensor | None], seen: set[int]) -> int:
    """Return the bytes of the storages of ``tensors`` not in ``seen`` (which it extends)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def formula_bytes(stage: int, psi: float, world_size: int, k: int = 8) -> float:
    """Return the float32 model-state bytes per rank of ``stage`` (0 = DDP) with ``k`` state bytes/value."""
    n = world_size
    return {
        0: (8 + k) * psi,
        1: 8 * psi + k * psi / n,
        2: 4 * psi + (4 + k) * psi / n,
        3: (8 + k) * psi / n,
    }[stage]


class Ledger:
    """Samples one rank's model-state bytes during a step; :meth:`close` returns the step's peaks."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        shards: list[torch.nn.Parameter],
        optimizer: Any = None,
    ) -> None:
        self.params, self.shards, self.optimizer = params, shards, optimizer
        self.settled: dict[str, int] = {}
        self.in_flight = self.activations = self.comm = self.rss = 0
        self.saved: SavedBytes | None = None
        self._saving: Any = None
        #: Held by whoever touches the model's tensors from Python while the other thread may:
        #: sample() runs on the training and communication threads, and a storage's Python object
        #: freed on one thread while the other references it aborts the process (PyTorch's
        #: "THPStorage_dealloc ... use_count() == 1" assert: stage 3 lost an engine that way)
        self.lock = threading.RLock()

    def watch_forward(self, net: torch.nn.Module) -> list[Any]:
        """Count what ``net``'s every forward saves for backward; return the hooks' handles."""

        def start(module: torch.nn.Module, args: Any) -> None:
            self.saved = SavedBytes(net.parameters())
            self._saving = self.saved.hooks()
            self._saving.__enter__()

        def stop(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._saving is not None:
                self._saving.__exit__(None, None, None)
                self._saving = None
                self.activations = max(self.activations, self.saved.total)
                self.rss = max(self.rss, rss_bytes())

        return [
            net.register_forward_pre_hook(start),
            net.register_forward_hook(stop, always_call=True),
        ]

    def sample(self, settled: bool, buffers: Iterable[torch.Tensor] = ()) -> None:
        """Count what is held now; ``settled``: a moment the formulas describe; ``buffers``: the
        exchange's own buffers held now (a view of a parameter or gradient is not counted)."""
        with self.lock:
            self._sample(settled, buffers)

    def _sample(self, settled: bool, buffers: Iterable[torch.Tensor]) -> None:
        seen: set[int] = set()
        row = {
            "ledger_params_bytes": held_bytes(list(self.params) + list(self.shards), seen),
            "ledger_grads_bytes": held_bytes([p.grad for p in self.params + self.shards], seen),
            "ledger_optimizer_bytes": held_bytes(self._state_tensors(), seen),
        }
        total = sum(row.values())
        self.comm = max(self.comm, held_bytes(buffers, seen))
        self.rss = max(self.rss, rss_bytes())
        self.in_flight = max(self.in_flight, total)
        if settled and total >= sum(self.settled.values()):
            self.settled = row

    def _state_tensors(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        return [
            v
            for state in self.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]

    def close(self) -> dict[str, int]:
        """Return this step's settled peak by kind, the in-flight peak and the ``EXTRA_KEYS``
        peaks; start a new step."""
        with self.lock:
            return self._close()

    def _close(self) -> dict[str, int]:
        out = dict(self.settled)
        out["ledger_settled_bytes"] = sum(self.settled.values())
        out["ledger_in_flight_bytes"] = self.in_flight
        out.update(zip(EXTRA_KEYS, (self.activations, self.comm, self.rss), strict=True))
        self.settled, self.in_flight = {}, 0
        self.activations = self.comm = self.rss = 0
        return out
