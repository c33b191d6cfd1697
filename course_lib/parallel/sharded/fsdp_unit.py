"""Lecture 11: ZeRO stage 3 (FSDP): weights sharded too, each module's unit gathered only while it runs.

Between steps a rank holds only its shards (weights, gradients, optimiser state: 16 Psi/N bytes
with float32 Adam). A module's unit is allgathered round the ring just before its forward and
released right after it (the parameters keep their shapes; their storage is resized to 0, as
FSDP does); a hook on the module's output gathers it again when backward reaches the module,
and once backward has produced all of the unit's gradients they are reduce-scattered (stage
2's hook) and the unit released. Each unit travels three times per step: 3(N-1)/N Psi values
per rank, half as much again as DDP. A tied parameter is gathered with its unit by every module
that uses it (more bytes than the formula; the formula assumes none).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.collectives.ring import ring_allgather
from course_lib.comm.communicator import Communicator
from course_lib.parallel.sharded.units import FlatUnit
from course_lib.parallel.sharded.zero import Zero2

__all__ = ["Zero3"]


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    """Return the first tensor in ``output`` that backward will reach (None in evaluation)."""
    items = output if isinstance(output, (tuple, list)) else [output]
    return next((t for t in items if isinstance(t, torch.Tensor) and t.requires_grad), None)


class Zero3(Zero2):
    """ZeRO stage 3: + weights sharded, gathered module by module (the FSDP unit)."""

    name, stage = "zero3", 3
    cost_collective = None  # three ring passes; the cost model has no such collective

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Shard every unit, release the full weights, hook every module that holds weights."""
        super().attach(comm, net)
        owner = {id(p): u for u in self.units for p in u.params}
        for module in net.modules():
            mine = [owner[id(p)] for p in module.parameters(recurse=False) if id(p) in owner]
            units = list({u.index: u for u in mine}.values())
            if units:
                self.handles.append(module.register_forward_pre_hook(self._before(units)))
                self.handles.append(module.register_forward_hook(self._after(units)))
        for unit in self.units:
            unit.free()
        return net

    def wrap_optimizer(self, comm: Communicator, optimizer: torch.optim.Optimizer) -> Any:
        """Stage 2's sharded optimiser, which a checkpoint can also ask for the whole weights."""
        inner = super().wrap_optimizer(comm, optimizer)
        inner.course_whole_weights = self.whole_weights  # read by course_lib.checkpoint.state
        return inner

    def whole_weights(self) -> dict[str, torch.Tensor]:
        """Return the model's whole weights by name (every rank calls it: each unit allgathered)."""
        for unit in self.units:
            self.gather(unit)
        weights = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        for unit in self.units:
            unit.free()
        return weights

    def _shard_of(self, unit: FlatUnit) -> nn.Parameter:
        """This rank's chunk as a parameter of its own (the flat buffer is released between uses)."""
        return nn.Parameter(unit.flat[unit.chunk(self.comm.rank)].detach().clone())

    def gather(self, unit: FlatUnit) -> None:
        """Allgather ``unit``'s weights from every rank's shard into its flat buffer."""
        if unit.gathered:
            return
        # The ring runs on a NumPy buffer of its own: a NumPy view would pin the flat buffer's
        # storage (PyTorch then refuses to resize it), so the values are copied in afterwards.
        buf = np.empty(unit.numel, dtype=np.float32)
        buf[unit.chunk(self.comm.rank)] = self.shards[unit.index].detach().numpy()
        ring_allgather(self.comm, buf)
        unit.allocate()
        with torch.no_grad():
            unit.flat.copy_(torch.from_numpy(buf))
        unit.gathered = True
        self.ledger.sample(settled=False, buffers=[torch.from_numpy(buf)])  # the ring's buffer

    def _before(self, units: list[FlatUnit]) -> Any:
        def gather_units(module: nn.Module, args: Any) -> None:
            for unit in units:
                self.gather(unit)

        return gather_units

    def _after(self, units: list[FlatUnit]) -> Any:
        def release_units(module: nn.Module, args: Any, output: Any) -> None:
            for unit in units:
                unit.free()
            out = _first_grad_tensor(output)
            if out is not None:  # backward reaches this module: gather its weights again first
                out.register_hook(lambda grad: [self.gather(u) for u in units] and None)

        return release_units

    def after_reduce(self, unit: FlatUnit) -> None:
        """Release the unit: backward has finished with it (all its gradients were produced)."""
        unit.free()

    def detach(self) -> None:
        """Remove the hooks and gather every unit, leaving the whole model on every rank."""
        super().detach()
        for unit in getattr(self, "units", []):
            self.gather(unit)
