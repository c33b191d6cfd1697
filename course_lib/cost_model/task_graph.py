"""Lecture 13: A strategy as a task graph: compute tasks on workers, transfers on links (source 003).

FlexFlow's execution simulator turns (operator graph, strategy) into tasks, each on one device:
a forward or backward shard on a worker, or one message on a directed link ``(src, dst)`` (a link
is a device that carries one transfer at a time, costed ``alpha + n beta`` by the kit's
:class:`~course_lib.cost_model.alpha_beta.LinkModel`). Between two operators, each worker's needed
input box is cut out of the boxes the producer's workers hold; what is not local travels (and in
the backward pass the gradients travel back, summed where several workers used the same input).
Collectives are expanded into their point-to-point messages (:mod:`course_lib.cost_model.messages`):
ring allreduces of the weight gradients of split-by-sample operators, of the partial sums of a
row-parallel layer, of the input gradient of a column layer fed by a replicated one; with ``zero``
(ZeRO, :mod:`course_lib.cost_model.sharding`) the gradients' reduce-scatters and the weights'
allgathers instead. The graph is built in segments (an operator's tasks, an edge's transfers), cached by the
configurations they depend on, so a strategy that differs in one operator rebuilds only its
neighbourhood: the first half of the delta simulation.

Kept whole: one class, ``TaskGraphBuilder``, whose segments and cache change together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig, check_strategy, in_boxes, out_boxes
from course_lib.cost_model.messages import Network, Task, message, network, ring_allreduce_tasks
from course_lib.cost_model.operators import BYTES, Operator, OperatorGraph
from course_lib.cost_model.sharding import (
    ZeroConfig,
    check_zero,
    ring_pass_done,
    ring_pass_tasks,
    zero_schedule,
    zero_state_bytes,
)

__all__ = ["LABEL_BYTES", "SYNCS", "TaskGraphBuilder"]

LABEL_BYTES = 8  # int64 class labels
SYNCS = ("per_operator", "after_backward")
CACHE_LIMIT = 50_000  # cached segments (a few MB) before the builder forgets them


def _volume(a, b) -> int:
    """Return the number of elements in the intersection of boxes ``a`` and ``b``."""
    v = 1
    for (a0, a1), (b0, b1) in zip(a, b, strict=True):
        side = (a1 if a1 < b1 else b1) - (a0 if a0 > b0 else b0)
        if side <= 0:
            return 0
        v *= side
    return v


def _synced(op: Operator, cfg: ParallelConfig) -> bool:
    """Return whether ``op``'s weights are replicated with different gradients (to be summed)."""
    return op.has_params and cfg.split in ("sample", "attribute") and cfg.degree > 1


def _fid(i, d):
    return f"{i:03d}F{d}"


def _bid(i, d):
    return f"{i:03d}B{d}"


class TaskGraphBuilder:
    """Build the task graph of any strategy for ``graph`` on ``world_size`` workers.

    ``costs(op, cfg, batch) -> (forward s, backward s)`` of one worker's shard (a
    :class:`~course_lib.cost_model.op_costs.MeasuredCosts` or ``FlopsCosts``); ``link`` the model
    of every link, or a :class:`Network` (model and topology). Segments are cached by the
    configurations they depend on. ``sync``: when replicated weights' gradients are summed:
    ``"per_operator"`` (a ring per operator as soon as its backward ends, overlapping the rest
    of the backward pass, as DDP's buckets do) or ``"after_backward"`` (one ring of every such
    gradient per group of workers after the whole backward pass, as the kit's plain ``ring``
    exchange and ``hybrid_step`` do). ``zero``: a :class:`~course_lib.cost_model.sharding.ZeroConfig`
    for ZeRO's sharded data parallelism (every operator split by samples), None for none.
    """

    def __init__(
        self,
        graph: OperatorGraph,
        world_size: int,
        costs,
        link: LinkModel | Network,
        sync: str = "per_operator",
        zero: ZeroConfig | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if sync not in SYNCS:
            raise ValueError(f"unknown sync {sync!r}; choose one of {SYNCS}")
        self.graph, self.world_size, self.costs, self.sync = graph, world_size, costs, sync
        self.link = network(link)
        self.zero = zero
        self._zero = zero_schedule(graph, zero) if zero else {"forward": {}, "backward": {}}
        self._zero_devices: tuple[int, ...] = tuple(range(world_size))
        self._consumers: dict[int, list[int]] = defaultdict(list)
        self._offsets: dict[tuple[int, int], int] = {}
        for i, op in enumerate(graph.ops):
            offset = 0
            for p in graph.producers(i):
                self._consumers[p].append(i)
                self._offsets[(p, i)] = offset if op.kind == "concat" else 0
                offset += graph.ops[p].out_shape[0] if p >= 0 else 0
        self._edges: dict = {}
        self._nodes: dict = {}
        self._costs: dict = {}

    # -- edges: op p (the previous one, an earlier one for a concat, -1 the input) -> op i -------
    def _producer(self, p: int, strategy) -> tuple[list, Callable]:
        """Return the producer's ``(worker, box)`` list and ``ready(worker) -> task ids``."""
        g = self.graph
        if p < 0:  # every worker loads its own samples: the input is split by samples over all
            cfg = ParallelConfig("sample", tuple(range(self.world_size)))
            in_op = Operator("input", "input", (), g.input_shape, 0, 0.0)
            return out_boxes(in_op, cfg, g.batch), lambda d: []
        op, cfg = g.ops[p], strategy[p]
        if cfg.split == "row" and cfg.degree > 1:  # the output exists after the allreduce
            n, devs = cfg.degree, cfg.devices
            last = {d: f"{p:03d}Ys{2 * n - 3}:{devs[(k - 1) % n]}>{d}" for k, d in enumerate(devs)}
            return out_boxes(op, cfg, g.batch), lambda d: [last[d]]
        return out_boxes(op, cfg, g.batch), lambda d: [_fid(p, d)]

    def _edge(self, p: int, i: int, strategy):
        key = (p, i, strategy[p] if p >= 0 else None, strategy[i])
        if key in self._edges:
            return self._edges[key]
        g, link = self.graph, self.link
        op, cfg = g.ops[i], strategy[i]
        produced, ready = self._producer(p, strategy)
        shift = self._offsets[(p, i)]  # where a concat puts this producer's channels
        holders = defaultdict(list)
        for d, box in produced:
            if shift:
                box = (box[0], (box[1][0] + shift, box[1][1] + shift), *box[2:])
            holders[box].append(d)
        pre = f"{i:03d}" if p == i - 1 else f"{i:03d}k{p:03d}"  # task ids of this edge
        needs = in_boxes(op, cfg, g.batch)
        tasks, fwd_ready, bwd_ready = [], defaultdict(list), defaultdict(list)
        sends = defaultdict(float)  # (src, dst) -> bytes, one message per pair and direction
        for j, (c, need) in enumerate(needs):
            for box, hs in holders.items():
                v = _volume(need, box)
                if not v:
                    continue
                if c in hs:
                    fwd_ready[c] += ready(c)
                else:
                    sends[(hs[j % len(hs)], c)] += BYTES * v
        for (src, dst), nbytes in sorted(sends.items()):
            tid = f"{pre}xf:{src}>{dst}"
            tasks.append(message(tid, src, dst, nbytes, ready(src), link))
            fwd_ready[dst].append(tid)
        if p >= 0:
            tasks += self._backward(i, pre, cfg, holders, needs, bwd_ready)
        result = (
            tasks,
            {d: sorted(set(v)) for d, v in fwd_ready.items()},
            {d: sorted(set(v)) for d, v in bwd_ready.items()},
        )
        self._edges[key] = result
        return result

    def _backward(self, i, pre, cfg, holders, needs, bwd_ready) -> list[Task]:
        """Return the transfers that bring op i's input gradients back to its producer's workers."""
        devs, link = cfg.devices, self.link
        if (
            len(holders) == 1
            and cfg.split != "replicate"
            and cfg.degree > 1
            and set(next(iter(holders.values()))) == set(devs)
            and all(need == next(iter(holders)) for _, need in needs)
        ):
            # replicated producer, every consumer used all of it: sum the partial gradients
            nbytes = BYTES * _volume(*(2 * [next(iter(holders))]))
            tasks, done = ring_allreduce_tasks(
                f"{pre}E", devs, nbytes, {d: [_bid(i, d)] for d in devs}, link
            )
            for d in devs:
                bwd_ready[d] += done[d]
            return tasks
        sends = defaultdict(float)
        for box, hs in holders.items():
            for h in hs:
                if cfg.split == "replicate":  # identical whole gradients: take one copy
                    if h in devs:
                        bwd_ready[h].append(_bid(i, h))
                    else:
                        sends[(devs[h % len(devs)], h)] += BYTES * _volume(needs[0][1], box)
                    continue
                for c, need in needs:  # partial or disjoint gradients: every piece, summed at h
                    v = _volume(need, box)
                    if v and c == h:
                        bwd_ready[h].append(_bid(i, h))
                    elif v:
                        sends[(c, h)] += BYTES * v
        tasks = []
        for (src, dst), nbytes in sorted(sends.items()):
            tid = f"{pre}xb:{src}>{dst}"
            tasks.append(message(tid, src, dst, nbytes, [_bid(i, src)], link))
            bwd_ready[dst].append(tid)
        return tasks

    # -- nodes: one operator's compute tasks, its own collectives, labels for the loss ---------
    def clear(self) -> None:
        """Forget every cached segment (the next build starts from scratch)."""
        self._nodes.clear()
        self._edges.clear()

    def shard_cost(self, i: int, cfg: ParallelConfig) -> tuple[float, float]:
        """Return (forward, backward) seconds of operator ``i``'s shard under ``cfg`` (memoised)."""
        return self._cost(i, cfg)

    def _cost(self, i: int, cfg: ParallelConfig) -> tuple[float, float]:
        if (i, cfg) not in self._costs:
            self._costs[(i, cfg)] = self.costs(self.graph.ops[i], cfg, self.graph.batch)
        return self._costs[(i, cfg)]

    def _node(self, i: int, strategy):
        g = self.graph
        producers, consumers = g.producers(i), self._consumers[i]
        key = (
            i,
            tuple(strategy[p] if p >= 0 else None for p in producers),
            strategy[i],
            tuple(strategy[c] for c in consumers),
        )
        if key in self._nodes:
            return self._nodes[key]
        link, cfg, op = self.link, strategy[i], g.ops[i]
        fwd_ready, bwd_ready = defaultdict(list), defaultdict(list)
        for p in producers:
            for d, ids in self._edge(p, i, strategy)[1].items():
                fwd_ready[d] += ids
        for c in consumers:  # a skip connection's gradient comes back from two consumers
            for d, ids in self._edge(i, c, strategy)[2].items():
                bwd_ready[d] += ids
        fwd, bwd = self._cost(i, cfg)
        tasks, label_ready = [], defaultdict(list)
        if op.kind == "loss":  # labels come from the workers that loaded each sample
            n_all, per_sample = self.world_size, _volume(*(2 * [[(0, s) for s in op.in_shape[1:]]]))
            for d, need in in_boxes(op, cfg, g.batch):
                for k in range(n_all):
                    rows = max(
                        0,
                        min(need[0][1], (k + 1) * g.batch // n_all)
                        - max(need[0][0], k * g.batch // n_all),
                    )
                    if rows and k != d:
                        tid = f"{i:03d}l:{k}>{d}"
                        tasks.append(message(tid, k, d, LABEL_BYTES * rows * per_sample, [], link))
                        label_ready[d].append(tid)
        held = {d: BYTES * _volume(b, b) for d, b in out_boxes(op, cfg, g.batch)}
        gather_f, wait_b = self._zero["forward"].get(i), self._zero["backward"].get(i)
        for d in cfg.devices:
            preds = fwd_ready.get(d, []) + label_ready[d]
            if gather_f:  # ZeRO-3: this layer's weights gathered first
                preds.append(ring_pass_done(gather_f, self._zero_devices, d))
            tasks.append(Task(_fid(i, d), ("worker", d), fwd, tuple(preds), memory=held[d]))
        if cfg.split == "row" and cfg.degree > 1:
            more, _ = ring_allreduce_tasks(
                f"{i:03d}Y",
                cfg.devices,
                op.out_bytes(g.batch),
                {d: [_fid(i, d)] for d in cfg.devices},
                link,
            )
            tasks += more
        for d in cfg.devices:
            preds = [_fid(i, d)] + list(bwd_ready.get(d, []))
            if wait_b:  # ZeRO: the collective the engine's thread ran just before
                preds.append(ring_pass_done(wait_b, self._zero_devices, d))
            tasks.append(Task(_bid(i, d), ("worker", d), bwd, tuple(preds), memory=-held[d]))
        if _synced(op, cfg) and self.sync == "per_operator" and not self.zero:
            more, _ = ring_allreduce_tasks(
                f"{i:03d}G",
                cfg.devices,
                BYTES * op.params,
                {d: [_bid(i, d)] for d in cfg.devices},
                link,
            )
            tasks += more
        self._nodes[key] = tasks
        return tasks

    def build(self, strategy: tuple[ParallelConfig, ...], check: bool = True) -> dict[str, Task]:
        """Return the tasks of ``strategy`` by id (segments reused from earlier builds)."""
        if check:
            check_strategy(self.graph, strategy, self.world_size)
        if self.zero:
            devices = check_zero(self.graph, strategy)
            if devices != self._zero_devices:
                self._zero_devices = devices
                self.clear()
        if len(self._nodes) + len(self._edges) > CACHE_LIMIT:  # a long search: start afresh
            self.clear()
        tasks = {}
        for i in range(len(self.graph.ops)):
            for p in self.graph.producers(i):
                for t in self._edge(p, i, strategy)[0]:
                    tasks[t.id] = t
            for t in self._node(i, strategy):
                tasks[t.id] = t
        if self.zero:
            for t in self._zero_tasks():
                tasks[t.id] = t
        elif self.sync == "after_backward":
            for t in self._sync_after_backward(strategy):
                tasks[t.id] = t
        return tasks

    def _zero_tasks(self) -> list[Task]:
        """Return ZeRO's ring passes, each worker issuing them one after another."""
        devs, ops, tasks, prev = self._zero_devices, range(len(self.graph.ops)), [], None
        for after, coll in self._zero["order"]:
            start = {}
            for d in devs:
                if after is None:
                    start[d] = []
                elif after[1] == "all":
                    start[d] = [_bid(i, d) for i in ops]
                else:
                    start[d] = [(_fid if after[0] == "F" else _bid)(after[1], d)]
                if prev is not None:
                    start[d].append(ring_pass_done(prev, devs, d))
            tasks += ring_pass_tasks(coll.tag, devs, coll.numel, coll.phase, start, self.link)
            prev = coll.tag
        return tasks

    def _sync_after_backward(self, strategy) -> list[Task]:
        """Return one ring per group of workers over all its replicated weights' gradients."""
        groups, backward = defaultdict(int), defaultdict(list)
        for i, (op, cfg) in enumerate(zip(self.graph.ops, strategy, strict=True)):
            for d in cfg.devices:
                backward[d].append(_bid(i, d))
            if _synced(op, cfg):
                groups[cfg.devices] += BYTES * op.params
        tasks = []
        for devs, nbytes in sorted(groups.items()):
            tag = "S" + "-".join(map(str, devs))
            tasks += ring_allreduce_tasks(tag, devs, nbytes, backward, self.link)[0]
        return tasks

    def state_bytes(self, strategy, optimizer_bytes: int = 0) -> dict[int, float]:
        """Return each worker's model state: weights, gradients, ``optimizer_bytes`` per value."""
        if self.zero:
            return zero_state_bytes(self.graph, self.zero, self._zero_devices, optimizer_bytes)
        return {d: b * (2 + optimizer_bytes / BYTES) for d, b in self.param_bytes(strategy).items()}

    def param_bytes(self, strategy) -> dict[int, float]:
        """Return the parameter bytes each worker holds under ``strategy`` (weights only)."""
        out = defaultdict(float)
        for op, cfg in zip(self.graph.ops, strategy, strict=True):
            for d in cfg.devices:
                if cfg.split == "row" and op.kind == "linear":
                    out[d] += BYTES * (
                        op.in_shape[0] // cfg.degree * op.out_shape[0] + op.out_shape[0]
                    )
                elif cfg.split == "column" and op.has_params:
                    out[d] += BYTES * op.params / cfg.degree
                else:
                    out[d] += BYTES * op.params
        return dict(out)
