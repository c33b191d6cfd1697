"""Run suites of communication checks on this rank; write each one's result when it passes.

Usage: ``mpiexec -n N python worker.py mpi SUITE[,SUITE...]`` or, for gloo, N processes with
RANK, WORLD_SIZE and MASTER_PORT set. Several suites run one after another on the same world
(``SUITE.rank{r}.json`` each), sparing a world's start (torch's import) per suite. Every rank
draws the same seeded cases, so each one knows every rank's input and can check results exactly
(integer-valued floats sum exactly in any order).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np
import torch
from launch import LEAVE_WITHOUT_FINALIZE, result_file  # this script's folder is first on sys.path

from course_lib import collectives as C
from course_lib.collectives.ring_pipelined import ring_allreduce_pipelined
from course_lib.comm import (
    CommError,
    CommMismatchError,
    CommTimeoutError,
    EmulatedLink,
    chunk_bounds,
    emulate,
    make_communicator,
)
from course_lib.comm.wire import collectives_wire_bytes
from course_lib.cost_model.alpha_beta import LinkModel, predict

ALLREDUCES = [C.ring_allreduce, C.star_allreduce, C.allreduce_naive, C.recursive_doubling_allreduce]
DTYPES = [np.float32, np.float16, np.float64]


def inputs(seed: int, p: int, size: int, dtype, integer: bool = True) -> np.ndarray:
    """Return every rank's input (shape p x size), the same on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 9, (p, size)) if integer else rng.standard_normal((p, size))
    return x.astype(dtype)


def as_kind(a: np.ndarray, use_torch: bool):
    return torch.from_numpy(a.copy()) if use_torch else a.copy()


def np_of(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def suite_collectives(comm) -> dict:
    p, r, cases = comm.world_size, comm.rank, 0
    rng = np.random.default_rng(1234)
    sizes = [0, 1, p - 1, p + 1, 7, 1000] + [int(s) for s in rng.integers(0, 300, 6)]
    for case, size in enumerate(sizes):
        for d, dtype in enumerate(DTYPES):
            use_torch = (case + d) % 2 == 0
            x = inputs(100 * case + d, p, size, dtype)
            expected = x.astype(np.float64).sum(0).astype(dtype)
            builtin = comm.allreduce(as_kind(x[r], use_torch))
            assert np.array_equal(np_of(builtin), expected), "built-in allreduce wrong"
            for fn in ALLREDUCES:
                got = fn(comm, as_kind(x[r], use_torch))
                assert np.array_equal(np_of(got), np_of(builtin)), f"{fn.__name__} {size} {dtype}"
            for op, ref in (("max", x.max(0)), ("min", x.min(0))):
                got = C.ring_allreduce(comm, as_kind(x[r], use_torch), op=op)
                assert np.array_equal(np_of(got), ref), f"ring {op}"
                assert np.array_equal(np_of(comm.allreduce(as_kind(x[r], use_torch), op=op)), ref)
            a, b = chunk_bounds(size, p)[r]
            rs = C.ring_reduce_scatter(comm, as_kind(x[r], use_torch))
            assert np.array_equal(
                np_of(rs)[a:b], np_of(comm.reduce_scatter(as_kind(x[r], use_torch)))
            )
            full = np.zeros(size, dtype)
            full[a:b] = x[r, a:b]
            gathered = C.ring_allgather(comm, full)
            assert np.array_equal(
                gathered, np.concatenate([x[q, slice(*chunk_bounds(size, p)[q])] for q in range(p)])
            )
            same = comm.allgather(as_kind(x[r], use_torch))
            assert np.array_equal(np_of(same), x), "built-in allgather"
            for src in {0, p - 1}:
                for bcast in (C.tree_broadcast, C.broadcast_naive):
                    got = bcast(comm, as_kind(x[r], use_torch), src=src)
                    assert np.array_equal(np_of(got), x[src]), f"{bcast.__name__} src {src}"
                assert np.array_equal(np_of(comm.broadcast(as_kind(x[r], use_torch), src)), x[src])
            for s in range(1, max(2, p // 2 + 1)):
                left, right = C.gossip_partners(r, p, s)
                ref = (x[left].astype(np.float64) + x[r] + x[right]) / 3 if p > 1 else x[r]
                got = C.gossip_step(comm, as_kind(x[r], use_torch), s)
                tol = 1e-2 if dtype == np.float16 else 1e-6
                assert np.allclose(np_of(got), ref, rtol=tol, atol=tol), f"gossip s={s}"
            cases += 1
    # random (non-integer) data: the ring equals the built-in closely and bitwise across ranks
    for dtype in DTYPES:
        x = inputs(7, p, 4099, dtype, integer=False)
        ring = C.ring_allreduce(comm, x[r].copy())
        tol = 5e-3 if dtype == np.float16 else 1e-5
        assert np.allclose(ring, comm.allreduce(x[r].copy()), rtol=tol, atol=tol)
        assert (comm.allgather(ring) == ring).all(), "ring results differ between ranks"
        for seg in (1000, 1 << 20):  # 4 or more segments a chunk on 2-4 ranks; one segment
            piped = ring_allreduce_pipelined(comm, x[r].copy(), segment_bytes=seg)
            assert np.array_equal(piped, ring), f"pipelined ring {dtype} segments of {seg} B"
    return {"cases": cases}


def tree_children(rank: int, world_size: int, src: int = 0) -> int:
    """Return how many ranks ``rank`` sends to in a binomial-tree broadcast from ``src``."""
    v, mask, children = (rank - src) % world_size, 1, 0
    while mask < world_size and not v & mask:  # below our lowest set bit (all bits for src)
        children += v + mask < world_size
        mask <<= 1
    return children


def suite_counters(comm) -> dict:
    p, r = comm.world_size, comm.rank
    n, out = 1001, {"numel": 1001}
    bounds = chunk_bounds(n, p)
    nbytes = [(b - a) * 4 for a, b in bounds]
    for name, fn in [
        ("ring", C.ring_allreduce),
        ("star", C.star_allreduce),
        ("naive", C.allreduce_naive),
        ("bcast", C.tree_broadcast),
    ]:
        comm.stats.reset()
        fn(comm, np.ones(n, np.float32))
        out[name] = [comm.stats.bytes_sent, comm.stats.messages_sent, comm.stats.bytes_received]
    # ring: every chunk but (r) in reduce-scatter, every chunk but (r + 1) in allgather
    expected_ring = 2 * sum(nbytes) - nbytes[r] - nbytes[(r + 1) % p]
    assert out["ring"] == [
        expected_ring,
        2 * (p - 1),
        2 * sum(nbytes) - nbytes[(r - 1) % p] - nbytes[r],
    ], (out["ring"], expected_ring)
    assert out["star"][0] == (4 * n * (p - 1) if r == 0 else 4 * n), out["star"]
    assert out["naive"][0] == 4 * n * (p - 1), out["naive"]
    # binomial tree from rank 0: the whole buffer once to each child, once in (except the root)
    kids = tree_children(r, p)
    assert out["bcast"] == [4 * n * kids, kids, 4 * n * (r != 0)], (out["bcast"], kids)
    # gossip: the model's message count is what the counters see, at s = 1 and s = N/2
    for s in sorted({1, max(1, p // 2)}):
        comm.stats.reset()
        C.gossip_step(comm, np.ones(n, np.float32), s)
        counted = predict("gossip_step", 0, p, LinkModel(alpha=1.0, beta=1.0), s=s)
        out[f"gossip_s{s}"] = [comm.stats.messages_sent, counted]
        assert comm.stats.messages_sent == counted, (s, out[f"gossip_s{s}"])
        assert comm.stats.bytes_sent == 4 * n * counted
    comm.stats.reset()
    comm.allreduce(np.ones(n, np.float32))
    assert comm.stats.collectives["allreduce"].calls == 1 and comm.stats.bytes_sent == 0
    out["ring_fraction"] = out["ring"][0] / (4 * n)  # measured: bytes this rank sent / buffer
    return out


def suite_wire(comm) -> dict:
    """Each built-in's derived wire bytes beside a from-scratch algorithm's counted bytes."""
    p, out = comm.world_size, {}
    # 1000 elements (a multiple of 2 and 4: every ring chunk equal), 1001 (unequal chunks),
    # 12 (48 bytes: MPICH's short allreduce, recursive doubling)
    for numel in (1000, 1001, 12):
        for name, builtin, scratch in [
            ("allreduce", comm.allreduce, C.ring_allreduce),
            ("allreduce_doubling", comm.allreduce, C.recursive_doubling_allreduce),
        ]:
            comm.stats.reset()
            builtin(np.ones(numel, np.float32))
            derived = collectives_wire_bytes(comm.stats, p, comm.backend)
            comm.stats.reset()
            scratch(comm, np.ones(numel, np.float32))
            out[f"{name}_{numel}"] = [derived, comm.stats.bytes_sent]
    # allgather: the built-in gathers 250 floats per rank, the ring fills a buffer of p * 250
    comm.stats.reset()
    comm.allgather(np.ones(250, np.float32))
    derived = collectives_wire_bytes(comm.stats, p, comm.backend)
    comm.stats.reset()
    C.ring_allgather(comm, np.ones(250 * p, np.float32))
    out["allgather_250"] = [derived, comm.stats.bytes_sent]
    comm.stats.reset()
    return out


def suite_errors(comm) -> dict:
    p, r, seen = comm.world_size, comm.rank, {}
    for bad in (p, -1, r):
        try:
            comm.send(np.ones(3), bad)
            raise AssertionError(f"peer {bad} accepted")
        except ValueError as exc:
            seen[f"peer {bad}"] = str(exc)
    assert f"0..{p - 1}" in seen[f"peer {p}"]
    if r == 0:  # size mismatch in point-to-point: the receiver names the sender
        comm.send(np.ones(5, np.float32), 1, tag=3)
    elif r == 1:
        try:
            comm.recv(np.zeros(3, np.float32), 0, tag=3)
            raise AssertionError("size mismatch not detected")
        except CommMismatchError as exc:
            assert "rank 0" in str(exc) and "5" in str(exc), exc
            seen["p2p"] = str(exc)
    try:  # built-in allreduce with different sizes on different ranks
        comm.allreduce(np.ones(10 + (r == p - 1), np.float32))
        raise AssertionError("allreduce size mismatch not detected")
    except CommMismatchError as exc:
        assert f"rank {p - 1}" in str(exc) or r == p - 1, exc
        seen["allreduce"] = str(exc)
    comm.timeout = 30.0
    comm.barrier()
    for fn in (comm.allreduce, lambda t: C.ring_allreduce(comm, t)):
        try:
            fn(torch.ones(4, dtype=torch.bool))
            raise AssertionError("bool reduction accepted")
        except TypeError as exc:
            seen["dtype"] = str(exc)
    comm.barrier()
    comm.timeout = (
        3.0  # last (it may time out): ranks that miss the mismatch wait for those that left
    )
    try:  # from-scratch ring with different sizes: caught by the message headers
        C.ring_allreduce(comm, np.ones(12 * p + (r == p - 1), np.float32))
        raise AssertionError("ring size mismatch not detected")
    except CommError as exc:  # mismatch where detected; timeout or closed connection elsewhere
        seen["ring"] = f"{type(exc).__name__}: {exc}"
    return seen


# Short enough to keep the suites quick, long enough that ranks released together by a barrier
# on a loaded 2-core machine still meet within it; only the silent rank may be reported.
SHORT = 3.0


def suite_timeouts(comm) -> dict:
    p, r, seen = comm.world_size, comm.rank, {}
    comm.barrier()  # start together (gloo ranks leave init_process_group at different times)
    comm.timeout = SHORT
    if comm.backend == "mpi":  # gloo closes every connection after its first timeout
        if r == 0:  # rank p-1 never sends
            try:
                comm.recv(np.zeros(4), p - 1, tag=5)
                raise AssertionError("recv did not time out")
            except CommTimeoutError as exc:
                assert f"rank {p - 1}" in str(exc), exc
                seen["timeout"] = str(exc)
        else:
            time.sleep(SHORT + 0.5)
        comm.timeout = 30.0
        comm.barrier()
        comm.timeout = SHORT
    if r != p - 1:  # rank p-1 never calls allreduce
        try:
            comm.allreduce(np.ones(4))
            raise AssertionError("allreduce did not time out")
        except CommTimeoutError as exc:
            assert f"[{p - 1}]" in str(exc), exc
            seen["collective timeout"] = str(exc)
    else:
        time.sleep(SHORT + 0.5)
    return seen


def suite_ring_sizes(comm) -> dict:
    """Each rank in turn passes the ring one element more than the others (mpi: rebuilt after)."""
    p, r, seen = comm.world_size, comm.rank, {}
    for odd in range(p):
        comm.timeout = 30.0
        comm.barrier()  # start together, so that only the mismatch makes a rank wait
        comm.timeout = SHORT
        try:
            C.ring_allreduce(comm, np.ones(12 * p + (r == odd), np.float32))
            seen[str(odd)] = "no error"
        except CommError as exc:
            seen[str(odd)] = f"{type(exc).__name__}: {exc}"
        comm.timeout = 30.0
        comm.rebuild()  # the failed ring's messages stay behind in the old communicator
    return seen


def suite_p2p_timeout(comm) -> dict:
    """Rank 0 receives from rank N-1, which never sends; on its own world, as gloo then closes."""
    p, r, seen = comm.world_size, comm.rank, {}
    comm.barrier()
    comm.timeout = SHORT
    if r == 0:
        t0 = time.time()
        try:
            comm.recv(np.zeros(4), p - 1, tag=5)
            raise AssertionError("recv did not time out")
        except CommTimeoutError as exc:
            seen["timeout"] = str(exc)
            seen["seconds"] = time.time() - t0
    elif r == p - 1:
        time.sleep(SHORT + 1.0)  # alive but silent, until rank 0 has given up
    return seen


def suite_leave_unevenly(comm) -> dict:
    """Rank 0 writes its result, then outlives the others by 2 s (tests the launcher).

    The others leave with os._exit as soon as every result is written, so mpiexec kills rank 0
    in its sleep: the race that a loaded machine plays on the errors and timeouts suites.
    """
    result = {"world_size": comm.world_size}
    if comm.rank == 0:
        result_dir = os.environ["COMM_RESULT_DIR"]
        with open(os.path.join(result_dir, result_file("leave_unevenly", 0)), "w") as f:
            f.write(json.dumps({"rank": 0, **result}))
        deadline = time.time() + 30
        names = [result_file("leave_unevenly", q) for q in range(comm.world_size)]
        while time.time() < deadline and not all(
            os.path.exists(os.path.join(result_dir, name)) for name in names
        ):
            time.sleep(0.05)
        time.sleep(2.0)
    return result


def suite_ready(comm) -> dict:
    """Only join the world (used to test the launcher)."""
    return {"world_size": comm.world_size}


def suite_main(comm) -> dict:
    return {
        "collectives": suite_collectives(comm),
        "counters": suite_counters(comm),
        "subgroup": suite_subgroup(comm),
        "check": suite_check(comm),
    }


LOOSE = 3.0  # upper bound on measured / modelled time under load (test_comm_backends.py too)


def suite_link(comm) -> dict:
    p, r = comm.world_size, comm.rank
    link = EmulatedLink(bandwidth=50e6, latency=2e-3)
    slow = emulate(comm, link)
    assert slow.emulated and "emulated" in slow.label and not comm.emulated
    buf, reps, out = np.zeros(500_000, np.uint8), 5, {}
    for name, c in (("real", comm), ("emulated", slow)):
        c.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if r == 0:
                c.send(buf, 1)
                c.recv(buf, 1)
            elif r == 1:
                c.recv(buf, 0)
                c.send(buf, 0)
        out[name] = (time.perf_counter() - t0) / (2 * reps)
    out["expected"] = link.transfer_time(buf.nbytes)
    if r == 0:  # rank 0 times whole round trips; rank 1 stops before its last message lands
        out["ratio"] = out["emulated"] / out["expected"]
        # never faster than alpha + n/B per message (the emulation guarantees it); the upper
        # bound only catches gross errors, since a loaded machine adds real time on top.
        # A link charged twice is caught exactly, without timing, by tests/lib/comm/test_emulated_link.py.
        assert 1.0 <= out["ratio"] < LOOSE, out
    model = LinkModel.from_link(link)
    for name, fn in (("ring_allreduce", C.ring_allreduce), ("star_allreduce", C.star_allreduce)):
        x = np.ones(250_000, np.float32)
        slow.barrier()
        t0 = time.perf_counter()
        fn(slow, x)
        took = np.array([time.perf_counter() - t0])
        comm.allreduce(took, op="max")  # the collective ends when its slowest rank does
        out[name] = float(took[0]) / predict(name, x.nbytes, p, model)
        # The alpha-beta formula charges alpha per message; the emulated link, like a real NIC,
        # lets one message's latency overlap the next one's transfer (star's gather and
        # broadcast), so the time can undercut the formula by a few alphas but never the
        # bandwidth term alone.
        floor = predict(name, x.nbytes, p, LinkModel(alpha=0.0, beta=model.beta))
        out[name + "_floor"] = float(took[0]) / floor
        assert out[name + "_floor"] >= 0.98, (name, out)
        # 4 busy-polling ranks on 2 loaded cores add real time: a loose bound, gross errors only
        assert out[name] < LOOSE, (name, out)
    return out


def suite_ring_calibration(comm) -> dict:
    """Fit alpha, beta from timed rings over an emulated link; return what every rank got."""
    from course_lib.cost_model.alpha_beta import collective_calibration

    link = EmulatedLink(bandwidth=20e6, latency=1e-3)
    cal = collective_calibration(emulate(comm, link), "ring_allreduce", [2**18, 2**20], reps=2)
    floor = LinkModel(alpha=0.0, beta=1.0 / link.bandwidth)  # the emulation's guarantee
    for size, samples in cal.samples.items():
        assert min(samples) >= 0.98 * predict("ring_allreduce", size, comm.world_size, floor)
    return {
        "alpha": cal.model.alpha,
        "beta": cal.model.beta,
        "sizes": cal.sizes,
        "times": cal.times,
        "samples": {str(k): v for k, v in cal.samples.items()},
        "label": cal.label,
    }


def suite_subgroup(comm) -> dict:
    p, r = comm.world_size, comm.rank
    ranks = [p - 1, 0]  # reversed on purpose: sub-ranks follow the given order
    sub = comm.subgroup(ranks)
    if r not in ranks:
        assert sub is None
        return {"member": False}
    assert sub.world_size == 2 and sub.rank == ranks.index(r), (sub.rank, r)
    x = np.full(5, float(r + 1))
    assert np.array_equal(C.ring_allreduce(sub, x.copy()), np.full(5, float(p + 1)))
    assert np.array_equal(sub.allreduce(x.copy()), np.full(5, float(p + 1)))
    # sub-rank 0 is global rank p-1: rows of allgather and broadcast's src follow sub-ranks
    assert np.array_equal(sub.allgather(x.copy())[:, 0], [float(q + 1) for q in ranks])
    assert np.array_equal(sub.broadcast(x.copy(), src=0), np.full(5, float(p)))
    a, b = chunk_bounds(5, 2)[sub.rank]
    assert np.array_equal(sub.reduce_scatter(x.copy()), np.full(b - a, float(p + 1)))
    return {"member": True, "sub_rank": sub.rank}


def _all_to_all_expected(blocks: dict, rank: int, p: int) -> np.ndarray:
    """The rows rank ``rank`` must end with: block (i, rank) of every rank i, rank 0's first."""
    return np.concatenate([blocks[i][rank] for i in range(p)])


def suite_all_to_all(comm) -> dict:
    """Built-in, pairwise and naive all-to-all on equal, uneven and empty blocks; their bytes."""
    p, r, out = comm.world_size, comm.rank, {"cases": 0}
    impls = {
        "builtin": lambda c, x, *a: c.all_to_all(x, *a),
        "pairwise": C.pairwise_all_to_all,
        "naive": C.all_to_all_naive,
    }
    rng = np.random.default_rng(77)
    # counts[i][j]: rows rank i sends rank j (None: equal blocks of 2); rows of shape (3, 2)
    plans = [None, rng.integers(0, 4, (p, p)), np.zeros((p, p), int), np.eye(p, dtype=int) * 3]
    for case, counts in enumerate(plans):
        for dtype, use_torch in [(np.float32, case % 2 == 0), (np.int64, case % 2 == 1)]:
            sizes = np.full((p, p), 2) if counts is None else counts
            blocks = {
                i: [inputs(1000 * case + 10 * i + j, int(sizes[i, j]), 6, dtype).reshape(-1, 3, 2)
                    for j in range(p)]
                for i in range(p)
            }  # fmt: skip
            mine = as_kind(np.concatenate(blocks[r]), use_torch)
            want = _all_to_all_expected(blocks, r, p)
            args = [] if counts is None else [list(sizes[r])]
            for name, fn in impls.items():
                for given in [False, True] if args else [False]:
                    extra = args + ([list(sizes[:, r])] if given else [])
                    comm.stats.reset()
                    got = fn(comm, mine, *extra)
                    assert type(got) is type(mine) and np.array_equal(np_of(got), want), (
                        name,
                        case,
                    )
                    assert np.array_equal(np_of(mine), np.concatenate(blocks[r]))  # unchanged
                    sent = (
                        sum(int(sizes[r, j]) for j in range(p) if j != r)
                        * 6
                        * np.dtype(dtype).itemsize
                    )
                    counted = (
                        comm.stats.collectives["all_to_all"].bytes
                        if name == "builtin"
                        else comm.stats.bytes_sent
                    )
                    counts_bytes = 0 if (counts is None or given) else 8 * (p - 1)
                    assert counted == sent + counts_bytes, (name, case, counted, sent)
                    if name == "builtin":
                        assert collectives_wire_bytes(comm.stats, p, comm.backend) == counted
                    out["cases"] += 1
    # a subgroup in reversed order: blocks follow the sub-ranks, not the global ranks
    ranks = list(range(p))[::-1]
    sub = comm.subgroup(ranks)
    x = np.array([100 * sub.rank + j for j in range(sub.world_size)], np.float32)
    want = np.array([100 * i + sub.rank for i in range(sub.world_size)], np.float32)
    assert np.array_equal(sub.all_to_all(x), want) and np.array_equal(
        C.pairwise_all_to_all(sub, x), want
    )
    # bad arguments: one line naming the fix, before any message
    for bad, words in [
        (np.zeros(p + 1) if p > 1 else np.zeros(()), "equal blocks" if p > 1 else "one dimension"),
        (np.zeros(p), "add up"),
    ]:
        try:
            comm.all_to_all(bad, None if "equal" in words or "dimension" in words else [0] * p)
            raise AssertionError("accepted a bad all_to_all")
        except ValueError as exc:
            assert words in str(exc), exc
    return out


def suite_check(comm) -> dict:
    from lecture03_answers import my_ring_allgather  # the check refuses the library's ring

    from course_lib.checks.lecture03 import check_ring_allgather_on_rank, stub_ring_allgather

    detail = check_ring_allgather_on_rank(comm, my_ring_allgather)
    try:
        check_ring_allgather_on_rank(comm, stub_ring_allgather)
        raise AssertionError("stub passed")
    except NotImplementedError:
        pass

    def gather_whole(c, buf):  # right answer, wrong traffic: sends the whole buffer each step
        full = c.allgather(np.ascontiguousarray(buf))
        bounds = chunk_bounds(buf.size, c.world_size)
        for q, (a, b) in enumerate(bounds):
            buf[a:b] = full[q][a:b]
        return buf

    try:
        check_ring_allgather_on_rank(comm, gather_whole)
        raise AssertionError("a non-ring allgather passed")
    except AssertionError as exc:
        if "passed" in str(exc):
            raise
    return {"detail": detail}


def main() -> None:
    """Run each suite of ``SUITES`` (comma-separated) in turn on one world; a file per suite."""
    backend, suites = sys.argv[1], sys.argv[2].split(",")
    kwargs = {}
    if backend == "gloo":
        kwargs = dict(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            master_port=int(os.environ["MASTER_PORT"]),
        )
    comm = make_communicator(backend, timeout=30, **kwargs)
    result_dir = os.environ["COMM_RESULT_DIR"]
    try:
        for i, suite in enumerate(suites):
            if i:  # each suite starts as on a world of its own: default timeout, zero counters
                comm.timeout = 30.0
                comm.barrier()
                comm.stats.reset()
            result = globals()[f"suite_{suite}"](comm)
            text = json.dumps({"rank": comm.rank, **result}, default=str)
            with open(os.path.join(result_dir, result_file(suite, comm.rank)), "w") as f:
                f.write(text)
        code = 0
        if suites[-1] not in LEAVE_WITHOUT_FINALIZE:
            comm.timeout = 60.0
            comm.barrier()
            if backend == "mpi":
                return  # a normal exit: mpi4py calls MPI_Finalize, so mpiexec reports success
            # gloo: every result is written; leave at once, because torch's teardown at exit
            # sometimes aborts ("terminate called without an active exception", 1 run in 15)
            # when rank 0, which holds the rendezvous store, has already gone

        # after errors and timeouts a clean shutdown could wait on a peer: wait for every
        # rank's result file of the last suite, then leave at once
        deadline = time.time() + 30
        last = [result_file(suites[-1], r) for r in range(comm.world_size)]
        while not all(os.path.exists(os.path.join(result_dir, name)) for name in last):
            if time.time() > deadline:
                break
            time.sleep(0.05)
    except BaseException:  # noqa: BLE001 - report everything, then leave without hanging
        print(f"[rank {comm.rank}] FAILED in suite {suite}\n{traceback.format_exc()}", flush=True)
        code = 1
    sys.stdout.flush()
    os._exit(code)  # skip MPI_Finalize / gloo teardown, which may wait on a peer that failed


if __name__ == "__main__":
    main()
