"""Lecture 4: Source 000's parameter server, with the mean computed right, and its published mistake kept.

Source 000 (Tomsk lab, steps 4-6): rank 0 is the server *and* computes a gradient like every
worker; workers send their gradients to the server, the server combines them and sends the
result back, and every rank applies it. Written from point-to-point messages of the kit's
Communicator, so a lecture can count every byte: a worker sends ``S`` and receives ``S``; the
server receives and sends ``(N-1) S``, which is why its link is the bottleneck.

``parameter_server_source000`` keeps the combination exactly as the source's code wrote it
(``grad_serv_mean`` in its repository): inside the loop over the *clients* it divides the
running gradient by the number of clients, then adds the client's gradient divided by that same
number. The server's own gradient is not counted, and the division inside the loop shrinks the
earlier terms again at each client: with N = 2 the "mean" is the sum $g_0 + g_1$; with N = 3 it
is $g_0/4 + g_1/4 + g_2/2$. The lecture runs it once and lets the equality test catch it.
"""

from __future__ import annotations

import numpy as np

from course_lib.comm.communicator import Communicator, wait_all
from course_lib.parallel.exchanges.base import FlatExchange

__all__ = ["PS_TAG", "ParameterServer", "ParameterServerSource000", "source000_combine"]

PS_TAG = 8120  # clear of course_lib.collectives.common.TAGS (8100-8108)


def source000_combine(server_grad: np.ndarray, client_grads: list[np.ndarray]) -> np.ndarray:
    """Return the source's combination: per client, ``g = g / C + g_client / C`` (C = clients).

    Kept as published, for teaching; it is *not* the mean (see the module docstring).
    """
    combined = server_grad.copy()
    count = len(client_grads)  # len(models_grads): the clients only, the server left out
    for grad in client_grads:
        combined /= count  # "reduce the gradients by the number of models", inside the loop
        combined += grad / count
    return combined


class ParameterServer(FlatExchange):
    """Rank 0 serves and computes: gather every gradient, average over all N ranks, send back.

    The mean is $\\frac{1}{N}(g_0 + g_1 + \\dots + g_{N-1})$, the server's own gradient
    included, summed in rank order so that the result never depends on arrival order.
    """

    name = "parameter_server"
    checkpointable = True
    cost_collective = "star_allreduce"
    server = 0

    def average(self, comm: Communicator, flat: np.ndarray) -> None:
        """Overwrite ``flat`` on every rank with the server's combination of all gradients."""
        n = comm.world_size
        if n == 1:
            self.combine_in_place(flat, [])
            return
        if comm.rank != self.server:
            comm.send(flat, self.server, PS_TAG)  # step 5: workers send gradients to the server
            comm.recv(flat, self.server, PS_TAG)  # step 6: and get the combined ones back
            return
        workers = [r for r in range(n) if r != self.server]
        received = {r: np.empty_like(flat) for r in workers}
        wait_all([comm.irecv(received[r], r, PS_TAG) for r in workers])
        self.combine_in_place(flat, [received[r] for r in workers])
        wait_all([comm.isend(flat, r, PS_TAG) for r in workers])

    def combine_in_place(self, server_grad: np.ndarray, client_grads: list[np.ndarray]) -> None:
        """Overwrite ``server_grad`` with the mean of it and ``client_grads`` (all N ranks)."""
        for grad in client_grads:
            server_grad += grad
        server_grad /= len(client_grads) + 1


class ParameterServerSource000(ParameterServer):
    """Source 000's published combination (a teaching bug): the equality test must fail on it."""

    name = "parameter_server_source000"

    def combine_in_place(self, server_grad: np.ndarray, client_grads: list[np.ndarray]) -> None:
        """Overwrite ``server_grad`` with :func:`source000_combine` (not the mean)."""
        if client_grads:
            server_grad[...] = source000_combine(server_grad, client_grads)
