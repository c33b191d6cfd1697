"""A4 graded out of the kernel's reach: the engines return data, the grader decides.

The kernel pushes the answer to its engines and has each rank call it on the grader's inputs
(drawn from a fresh seed, sent in the probe cell as arrays): the ranks' vectors ``w`` and counts
``n`` (A4.1), least-squares shards (A4.2), the vectors to gossip (A4.3, on all 4 ranks and on a
subgroup of 3). Each rank returns what the answer returned, the built-in collectives it called
(calls and bytes) and its point-to-point bytes per peer, as data. The grader re-derives the
inputs from the seed, computes the references (the weighted mean, the single-process Local-SGD
and its usual mistakes, the product of the mixing matrices) and judges every rank with
:mod:`course_grader.assignments.a4.judge`, in its own process. The kernel sees the parts of
the kit the engines need (``comm``, ``cluster``, ...) but not ``course_lib.checks``.

The counters are counted inside the student's processes (the engines), so the grader also
counts the bytes between the ranks on the wire, outside the sandbox, and they must agree
(:func:`a4_claims`, :mod:`course_grader.verdict.wire`): A4.1's and A4.2's allreduce through
a model of gloo's ring, A4.3's messages one by one. An answer that averages with two calls, or
with messages to one rank, and rewrites ``comm.stats`` to say one allreduce, fails there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.verdict.claims import Claims, ClaimsBuilder
from course_grader.verdict.engine_probe import pushed_spec
from course_grader.verdict.probe import ProbeSpec
from course_lib.i18n import _

__all__ = ["KIT_CUT", "a4_cases", "a4_claims", "a4_spec"]

WORLD_SIZE = 4
#: Bytes a pair may carry beyond its claims: A4.3's probe builds a subgroup of 3 (over the
#: rendezvous store at rank 0), the others nothing.
_WIRE_SLACK = {"A4.1": 64, "A4.2": 64, "A4.3": 1024}

_ENGINE_SETUP = """\
    def engine_case(fn, case):
        import numpy as np
        from IPython import get_ipython

        namespace = get_ipython().user_ns
        comm = namespace["comm"]
        rank, p = comm.rank, comm.world_size
        if p != 4:
            return rank, p, None, [], [], [], p
        kind = case["kind"]
        if kind == "gossip" and case["world_size"] != p:  # every rank calls subgroup
            groups = namespace.setdefault("_a4_probe_subgroups", {{}})
            key = (id(comm), case["world_size"])
            if key not in groups:
                groups[key] = comm.subgroup(list(range(case["world_size"])))
            comm = groups[key]
            if comm is None:  # outside the subgroup: nothing to call
                return rank, p, None, [], [], [], 0
        comm.stats.reset()
        if kind == "average":
            got = fn(comm, case["ws"][rank].copy(), int(case["counts"][rank]))
        elif kind == "local_sgd":
            got = fn(comm, case["w0"].copy(), case["X"][rank].copy(), case["y"][rank].copy(),
                     case["lr"], case["period"], case["num_steps"])
        else:
            got = fn(comm, case["xs"][rank].astype(case["dtype"]), case["num_steps"])
        peers = sorted(comm.stats.peers.items())
        used = [[name, c.calls, c.bytes] for name, c in sorted(comm.stats.collectives.items())]
        sent = [[q, s.bytes_sent, s.messages_sent] for q, s in peers
                if s.bytes_sent or s.messages_sent]
        received = [[q, s.bytes_received] for q, s in peers if s.messages_received]
        got = None if got is None else np.asarray(got)
        return rank, p, got, used, sent, received, comm.world_size

    cluster.view.push({{"{name}": {name}}}, block=True)  # later answers call it by name
"""
_CALL = "cluster.run(engine_case, {name}, case, timeout=60)"
_EXERCISES = {  # exercise: (function, kind)
    "A4.1": ("weighted_average", "average"),
    "A4.2": ("local_sgd", "local_sgd"),
    "A4.3": ("directed_gossip", "gossip"),
}


def a4_cases(kind: str, seed: int) -> list[dict]:
    """A4's cases for ``kind`` on the grader's seed: every rank's inputs, as arrays."""
    from course_grader.assignments.a4 import judge as j

    if kind == "average":
        cases = []
        for size in j.A4_SIZES:
            for dtype in ("float32", "float64"):
                ws, counts = j.average_inputs(size, dtype, WORLD_SIZE, seed)
                cases.append(
                    {
                        "kind": kind,
                        "size": size,
                        "dtype": dtype,
                        "ws": np.stack(ws),
                        "counts": counts,
                    }
                )
        return cases
    if kind == "local_sgd":
        shards = j.local_sgd_shards(WORLD_SIZE, seed)
        return [
            {
                "kind": kind,
                "period": period,
                "num_steps": num_steps,
                "lr": j.LR,
                "w0": np.zeros(shards[0][0].shape[1]),
                "X": [X for X, _y in shards],
                "y": [y for _x, y in shards],
            }
            for period, num_steps in j.LOCAL_SGD_CASES
        ]
    return [
        {
            "kind": kind,
            "world_size": p,
            "num_steps": k,
            "dtype": dtype,
            "xs": j.gossip_inputs(p, seed),
        }
        for p, k in j.GOSSIP_CASES
        for dtype in ("float64", "float32")
    ]


def _judge_rank(case: dict, rank: int, got: Any, used: dict, sent: dict, received: dict) -> str:
    """Return "" or what is wrong with one rank, by the notebook's own judge."""
    from course_grader.assignments.a4 import judge as j

    kind = case["kind"]
    if kind == "average":
        ws = list(case["ws"])
        return j.judge_average(
            case["size"], case["dtype"], rank, ws, case["counts"], got, used, sent, received
        )
    if kind == "local_sgd":
        shards = list(zip(case["X"], case["y"], strict=True))
        return j.judge_local_sgd(case["period"], case["num_steps"], rank, shards, got, used, sent)
    return j.judge_gossip(
        case["num_steps"], case["dtype"], rank, case["xs"], got, used, sent, received
    )


def _judge_case(case: dict, ranks: Any) -> None:
    """Raise AssertionError with the first rank's problem (rank order), as the notebook does."""
    if not isinstance(ranks, list) or not ranks or not isinstance(ranks[0], tuple):
        raise AssertionError(_("the engines returned no result"))
    world_size = int(ranks[0][1])
    if world_size != WORLD_SIZE:
        raise AssertionError(_("the check needs 4 engines, not {n}").format(n=world_size))
    by_rank = {int(r[0]): r for r in ranks}
    if len(ranks) != WORLD_SIZE or sorted(by_rank) != list(range(WORLD_SIZE)):
        raise AssertionError(_("the engines' results do not come one from each rank"))
    # Ranks outside A4.3's subgroup of 3 call nothing: only the members are judged.
    for rank in range(case.get("world_size", WORLD_SIZE)):
        _rank, _p, got, used, sent, received = by_rank[rank][:6]
        if isinstance(got, str):  # not data: the decoder says which type it was
            raise AssertionError(
                _("rank {rank} returned {got}, not an array").format(rank=rank, got=got)
            )
        why = _judge_rank(
            case,
            rank,
            got,
            {str(n): (int(c), int(b)) for n, c, b in used if str(n) != "barrier"},
            {int(row[0]): int(row[1]) for row in sent},
            {int(q): int(nbytes) for q, nbytes in received},
        )
        if why:
            raise AssertionError(why)


def _body(exercise: str, answer: Any, seed: int) -> str:
    """Judge the replayed answer on every case of ``exercise``; return the PASS detail."""
    from course_grader.assignments.a4.checks import a4_detail

    for case in a4_cases(_EXERCISES[exercise][1], seed):  # the grader's own copy of the inputs
        _judge_case(case, answer(case))
    return a4_detail(exercise)


def a4_claims(cases: list) -> list[Claims]:
    """What the ranks reported sending, summed over the cases (:meth:`ClaimsBuilder.alternatives`).

    Each rank returns (rank, 4, result, built-ins [(name, calls, bytes)], rows of (peer, bytes
    sent, messages sent), bytes received per peer, the size of the communicator it used): A4.3's
    subgroup numbers its 3 ranks as the engines' first 3, and the rank outside it reports nothing.
    """
    claims = ClaimsBuilder()
    for ranks in cases:
        for rank, _p, _got, used, sent, _received, group_size in ranks:
            for peer, nbytes, messages in sent:
                claims.sent(int(rank), int(peer), int(nbytes), int(messages))
            claims.builtins(int(rank), int(group_size), used)
    return claims.alternatives()


#: The kit's own answers to A4: Local SGD's averaging and gossip's exchange. Its kernel's kit has
#: them only as stubs (course_grader.sandbox.kit_cut); the rest of the kit works as ever.
KIT_CUT = (
    "course_lib.collectives.gossip:gossip_step",
    "course_lib.parallel.exchanges.local_sgd:LocalSGD.average",
    "course_lib.parallel.data_parallel.reference_local_sgd:simulate_local_sgd",
)


def a4_spec() -> ProbeSpec:
    """A4's probes: the engines run the answers, the grader judges every rank's data."""
    from course_grader.assignments.a4.checks import A4_POINTS

    return pushed_spec(
        _EXERCISES,
        _CALL,
        _ENGINE_SETUP,
        inputs=a4_cases,
        body=_body,
        points=A4_POINTS,
        claims=a4_claims,
        wire_slack=_WIRE_SLACK,
        kit_cut=KIT_CUT,
    )
