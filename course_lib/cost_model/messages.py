"""Lecture 13: Messages as tasks: what a transfer occupies, and a ring allreduce as its messages.

In FlexFlow's simulator (source 003) a link is a device like a worker: it carries one transfer at
a time, so two messages on one link queue up. A message of ``n`` bytes costs ``alpha + n beta``
(the kit's :class:`~course_lib.cost_model.alpha_beta.LinkModel`, calibrated in lecture 3); which
messages share a wire is the :class:`Network`'s topology. A collective is not one task but its
point-to-point messages, so the simulator sees what the kit's ring really sends: 2(N-1) steps of
N messages of S/N bytes for a ring allreduce (``course_lib.collectives.ring``).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.cost_model.alpha_beta import LinkModel

__all__ = ["TOPOLOGIES", "Network", "Task", "message", "network", "ring_allreduce_tasks"]


@dataclass(frozen=True)
class Task:
    """One task: ``device`` is ``("worker", k)`` or ``("link", src, dst)``; runs after ``preds``.

    ``nbytes`` is a transfer's payload; ``memory`` the activation bytes a compute task allocates
    (forward, positive) or frees (backward, negative) on its worker when it ends.
    """

    id: str
    device: tuple
    seconds: float
    preds: tuple[str, ...] = ()
    nbytes: float = 0.0
    memory: float = 0.0
    src: int = -1  # a transfer's sending worker


TOPOLOGIES = ("pairs", "nic", "bus")


@dataclass(frozen=True)
class Network:
    """The links' cost model and what a transfer occupies (``topology``).

    ``pairs``: every directed pair of workers is its own link (a full-duplex switched network);
    ``nic``: each worker sends one message at a time, whoever receives it (one network card);
    ``bus``: one message at a time in the whole machine (a shared bus or hub).
    """

    model: LinkModel
    topology: str = "pairs"

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.topology!r}; choose one of {TOPOLOGIES}")

    def device(self, src: int, dst: int) -> tuple:
        """Return the device a message from ``src`` to ``dst`` occupies."""
        if self.topology == "pairs":
            return ("link", src, dst)
        return ("link", src) if self.topology == "nic" else ("link", "bus")


def network(link: LinkModel | Network) -> Network:
    """Return ``link`` as a :class:`Network` (a bare LinkModel: every pair its own link)."""
    return link if isinstance(link, Network) else Network(link)


def message(tid, src, dst, nbytes, preds, link: Network, reduce=False) -> Task:
    """Return the task of one message of ``nbytes`` (plus reduction time if ``reduce``)."""
    m = link.model
    seconds = m.alpha + nbytes * m.beta + (nbytes * m.gamma if reduce else 0.0)
    return Task(tid, link.device(src, dst), seconds, tuple(preds), float(nbytes), src=src)


def ring_allreduce_tasks(tag: str, devices, nbytes: float, start: dict, link: LinkModel | Network):
    """Return (tasks, done) of a ring allreduce of ``nbytes`` over ``devices``.

    Step s (0 .. 2(N-1)-1) sends one chunk of ``nbytes / N`` from each ``devices[i]`` to
    ``devices[i+1]``, after what ``devices[i]`` received in step s-1; the first N-1 steps
    reduce (reduce-scatter), the rest copy (all-gather). ``start[d]``: tasks after which worker
    ``d``'s buffer is ready; ``done[d]``: tasks after which it holds the sum.
    """
    n, link = len(devices), network(link)
    if n == 1:
        return [], {devices[0]: list(start[devices[0]])}
    tasks, chunk = [], nbytes / n
    ids = [
        [f"{tag}s{s}:{devices[i]}>{devices[(i + 1) % n]}" for i in range(n)]
        for s in range(2 * (n - 1))
    ]
    for s in range(2 * (n - 1)):
        for i, d in enumerate(devices):
            preds = list(start[d]) + ([ids[s - 1][(i - 1) % n]] if s else [])
            tasks.append(
                message(ids[s][i], d, devices[(i + 1) % n], chunk, preds, link, reduce=s < n - 1)
            )
    last = ids[-1]
    return tasks, {d: [last[(i - 1) % n]] for i, d in enumerate(devices)}
