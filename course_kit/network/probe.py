"""Lecture 3 and the instructor's guide: The network doctor's probes: a TCP sink on one PC, timed sends and clock reads from another.

Plain TCP sockets, so that the doctor measures the lab's network before any communicator exists
(and with the same kind of connection gloo opens: a port above 1024 that the OS picks). A
:class:`Sink` reads framed messages and answers each with one byte, or with its clock;
:func:`measure_to` runs on the sending PC: round trips of empty messages give the latency, the
time until a large message is acknowledged, less one round trip, gives the bandwidth, and
Cristian's algorithm (Cristian 1989) gives the clock offset within half the shortest round trip.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["SINKS", "Sink", "close_sink", "measure_to", "open_sink", "pick_address"]

HEADER = struct.Struct("!Q")  # the length of the message that follows
PING = 0  # an empty message: answered with one byte at once
CLOCK = 2**64 - 1  # not a length: answered with the sink's time.time() as a double
CHUNK = 1 << 20

# Sinks opened on this engine by the doctor, by port, until it closes them.
SINKS: dict[int, Sink] = {}


def _recv_exactly(conn: socket.socket, n: int, buffer: memoryview | None = None) -> bytes:
    """Read ``n`` bytes (into ``buffer`` in chunks, returning b"", when one is given)."""
    parts, left = [], n
    while left:
        if buffer is not None:
            got = conn.recv_into(buffer, min(left, len(buffer)))
        else:
            part = conn.recv(left)
            parts.append(part)
            got = len(part)
        if not got:
            raise ConnectionError("the peer closed the connection mid-message")
        left -= got
    return b"".join(parts)


class Sink:
    """A TCP server on a port above 1024 that acknowledges every message it reads."""

    def __init__(self, host: str = "0.0.0.0") -> None:
        self.server = socket.create_server((host, 0))  # port 0: the OS picks a free one
        self.port = self.server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="doctor-sink").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        buffer = memoryview(bytearray(CHUNK))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, contextlib.suppress(OSError):
            while header := _recv_exactly(conn, HEADER.size):
                (n,) = HEADER.unpack(header)
                if n == CLOCK:
                    conn.sendall(struct.pack("!d", time.time()))
                    continue
                _recv_exactly(conn, n, buffer)
                conn.sendall(b"k")

    def close(self) -> None:
        """Stop accepting connections."""
        self._closed.set()
        # close() alone leaves the port listening while the accept thread blocks in accept();
        # shutdown() wakes it on Linux.
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


def open_sink() -> int:
    """Open a :class:`Sink` on this engine; return its port."""
    sink = Sink()
    SINKS[sink.port] = sink
    return sink.port


def close_sink(port: int) -> None:
    """Close the sink :func:`open_sink` opened on ``port`` (nothing if it is gone)."""
    if (sink := SINKS.pop(port, None)) is not None:
        sink.close()


def pick_address(theirs: Sequence[Sequence[str]], own: Sequence[Sequence[str]]) -> str:
    """Return the peer's address (``[name, address, netmask]`` list) on a subnet we share."""
    import ipaddress

    for _, addr, _ in theirs:
        for _, mine, mask in own:
            if mask and ipaddress.ip_address(addr) in ipaddress.ip_network(f"{mine}/{mask}", False):
                return addr
    if not theirs:
        raise ValueError("the peer reports no IPv4 address other than loopback")
    return theirs[0][1]  # another subnet: the route through a router may still reach it


def measure_to(
    theirs: Sequence[Sequence[str]],
    port: int,
    nbytes: int,
    repeats: int = 3,
    timeout: float = 5.0,
    clock: bool = False,
) -> dict[str, Any]:
    """Run on the sending PC: latency, bandwidth (and clock offset) towards a :class:`Sink`.

    Returns ``address``, ``latency`` (s, half the median round trip of an empty message),
    ``bandwidth`` (bytes/s, the fastest of ``repeats`` sends of ``nbytes`` after one warm-up) and,
    with ``clock``, ``offset`` (the sink's clock minus ours, s) and ``offset_error`` (its bound),
    or ``error`` saying why no connection could be made.
    """
    from course_lib.comm.rendezvous import describe_pc

    addr = pick_address(theirs, describe_pc()["interfaces"])
    try:
        conn = socket.create_connection((addr, port), timeout=timeout)
    except TimeoutError:
        return {"address": addr, "error": f"no answer on TCP port {port} within {timeout:g} s"}
    except OSError as exc:
        return {"address": addr, "error": f"TCP port {port}: {exc.strerror or exc}"}
    with conn:
        conn.settimeout(max(timeout, 10 * nbytes / 1e6))  # even 1 Mbit/s finishes in time
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(7):
            t0 = time.perf_counter()
            conn.sendall(HEADER.pack(PING))
            _recv_exactly(conn, 1)
            rtts.append(time.perf_counter() - t0)
        rtt = statistics.median(rtts[1:])
        payload = HEADER.pack(nbytes) + bytes(nbytes)
        sends = []
        for _ in range(repeats + 1):  # the first send opens TCP's window
            t0 = time.perf_counter()
            conn.sendall(payload)
            _recv_exactly(conn, 1)
            sends.append(time.perf_counter() - t0)
        # The fastest send, not the median: load on either PC (or on this shared machine's
        # emulated room) only ever slows a transfer down, and the doctor asks what the link
        # can carry.
        elapsed = min(sends[1:])
        result = {
            "address": addr,
            "latency": rtt / 2,
            "bandwidth": nbytes / max(elapsed - rtt, 1e-9),
        }
        if clock:
            result.update(_clock_offset(conn))
    return result


def _clock_offset(conn: socket.socket, tries: int = 7) -> dict[str, float]:
    """Cristian's algorithm: the peer's time minus ours, from the read with the shortest trip."""
    best = None
    for _ in range(tries):
        t0 = time.time()
        conn.sendall(HEADER.pack(CLOCK))
        (theirs,) = struct.unpack("!d", _recv_exactly(conn, 8))
        t1 = time.time()
        # The peer read its clock somewhere within [t0, t1] of ours: the midpoint errs by at
        # most half the round trip.
        sample = (theirs - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or sample[1] < best[1]:
            best = sample
    return {"offset": best[0], "offset_error": best[1]}
