"""The segmented, pipelined ring allreduce gives bitwise the plain ring's result (threads here;
real gloo and MPI ranks in comm_workers/worker.py's ``main`` suite)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

import numpy as np
import pytest
import torch
from comm_workers.threads import ThreadCommunicator, run_threads

from course_lib.collectives import ring_allreduce
from course_lib.collectives.ring import ring_allgather, ring_reduce_scatter
from course_lib.collectives.ring_pipelined import (
    MAX_SEGMENTS,
    ring_allgather_pipelined,
    ring_allreduce_pipelined,
    ring_reduce_scatter_pipelined,
    segment_bounds,
)


@pytest.mark.parametrize("p", [1, 3, 4])
@pytest.mark.parametrize("size", [0, 7, 4099])
@pytest.mark.parametrize("segment_bytes", [12, 1 << 20])
@pytest.mark.parametrize("agreed", [False, True])  # True: no size check round the ring (zero0's)
def test_pipelined_ring_equals_the_plain_ring_bitwise(p, size, segment_bytes, agreed):
    x = np.random.default_rng(size + p).standard_normal((p, size)).astype(np.float32)
    piped = run_threads(
        p,
        lambda c: ring_allreduce_pipelined(
            c, x[c.rank].copy(), segment_bytes=segment_bytes, agreed=agreed
        ),
    )
    plain = run_threads(p, lambda c: ring_allreduce(c, x[c.rank].copy()))
    for got in piped:
        assert np.array_equal(got, plain[0])
    assert np.allclose(piped[0], x.sum(0), rtol=1e-5, atol=1e-5)


def _bits(buf) -> np.ndarray:
    return buf if isinstance(buf, np.ndarray) else buf.view(torch.int16).numpy()


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("agreed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pipelined_reduce_scatter_and_allgather_equal_the_plain_rings_bitwise(p, agreed, dtype):
    # stage 3's passes: the same chunks reduced in the same order (bfloat16 as torch adds it);
    # whole buffers compared, as the reduce-scatter leaves partial sums in the other chunks
    x = torch.from_numpy(np.random.default_rng(p).standard_normal((p, 4099)).astype(np.float32))
    x = x.to(dtype)
    for piped_fn, plain_fn in (
        (ring_reduce_scatter_pipelined, ring_reduce_scatter),
        (ring_allgather_pipelined, ring_allgather),
    ):
        piped = run_threads(p, lambda c, f=piped_fn: f(
            c, x[c.rank].clone(), segment_bytes=100, agreed=agreed))  # fmt: skip
        plain = run_threads(p, lambda c, f=plain_fn: f(c, x[c.rank].clone()))
        for got, want in zip(piped, plain, strict=True):
            assert np.array_equal(_bits(got), _bits(want)), piped_fn.__name__


def test_pipelined_ring_takes_max_and_sends_what_the_ring_sends():
    p, x = 4, np.arange(4 * 40, dtype=np.float64).reshape(4, 40)[::-1].copy()

    def body(comm):
        out = ring_allreduce_pipelined(comm, x[comm.rank].copy(), "max", segment_bytes=16)
        return out, comm.stats.peer((comm.rank + 1) % p)

    for out, right in run_threads(p, body):
        assert np.array_equal(out, x.max(0))
        # 2(N-1)/N of the buffer to the right neighbour: 10 values a chunk, 2 per 16-byte
        # segment; plus one message of two int64 (size and dtype, agreed before eager receives)
        assert right.bytes_sent == 2 * (p - 1) * 10 * 8 + 16
        assert right.messages_sent == 2 * (p - 1) * 5 + 1


def test_segments_cover_the_chunk():
    pieces = segment_bounds(10, 47, 5)
    assert pieces[0][0] == 10 and pieces[-1][1] == 47
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))
    assert MAX_SEGMENTS * 2 + 8120 <= 8192  # every segment tag stays under the tag limit


def test_buffers_of_different_sizes_are_an_error_naming_the_ranks():
    from course_lib.comm import CommMismatchError

    with pytest.raises(
        CommMismatchError, match=r"rank [01] has [45] elements .* but rank [01] has [45] "
    ):
        run_threads(2, lambda c: ring_allreduce_pipelined(c, np.ones(4 + c.rank)), timeout=5.0)


def test_bad_segment_size_is_refused():
    with pytest.raises(ValueError, match="segment_bytes must be >= 1"):
        run_threads(2, lambda c: ring_allreduce_pipelined(c, np.ones(4), segment_bytes=0))


class _PostedFabric:
    """Messages move the moment both ends are posted, from and into the live buffers.

    That is how gloo's transport works (the sender writes from its own buffer into the posted
    receive while the receiver does other things), unlike ``run_threads``, whose receives copy
    only inside ``wait``: a receive posted into memory that still holds an unread segment is
    overwritten here as it would be on a real link.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sends: dict = defaultdict(deque)  # (src, dst, tag) -> unmatched (buffer, done event)
        self.recvs: dict = defaultdict(deque)

    def post(self, kind: str, arr: np.ndarray, key: tuple) -> threading.Event:
        done = threading.Event()
        with self.lock:
            others = self.recvs[key] if kind == "send" else self.sends[key]
            if not others:
                (self.sends if kind == "send" else self.recvs)[key].append((arr, done))
                return done
            other, other_done = others.popleft()
            src, dst = (arr, other) if kind == "send" else (other, arr)
            dst.view(np.uint8)[...] = src.view(np.uint8)
        other_done.set()
        done.set()
        return done


class _PostedCommunicator(ThreadCommunicator):
    def _post_send(self, arr, dst, raw_tag):
        return self.fabric.post("send", arr, (self.rank, dst, raw_tag))

    def _post_recv(self, arr, src, raw_tag):
        return self.fabric.post("recv", arr, (src, self.rank, raw_tag))

    def _wait_raw(self, req, deadline):
        return req.wait(max(deadline - time.time(), 1e-3))


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("size", [4099, 10_007])
def test_pipelined_ring_is_exact_when_data_lands_as_soon_as_posted(p, size):
    """Receives are posted a step ahead into scratch slots; no segment may land on an unread one.

    With these sizes the chunks differ in length by one element, so segment j of one chunk is a
    little longer than segment j of the next: each needs its own slot in the scratch buffer.
    """
    x = np.random.default_rng(size + p).standard_normal((p, size)).astype(np.float32)
    fabric = _PostedFabric()
    results: list = [None] * p

    def body(rank):
        comm = _PostedCommunicator(fabric, rank, p, timeout=20.0)
        results[rank] = ring_allreduce_pipelined(comm, x[rank].copy(), segment_bytes=64)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    plain = run_threads(p, lambda c: ring_allreduce(c, x[c.rank].copy()))
    for got in results:
        assert got is not None and np.array_equal(got, plain[0])
