"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): Shaping a room's links: a token bucket (``tc ... tbf``) on both ends of every PC's veth.

tbf shapes only what a device sends, so each link gets one qdisc on the bridge's end (switch ->
PC) and one on the PC's own interface (PC -> switch): traffic between two PCs crosses two links,
as through a switch.
"""

from __future__ import annotations

from course_kit.room.namespaces import PC, Room, run_or_raise

__all__ = ["BURST", "QUEUE_LATENCY", "shape_link", "shape_pc"]

# tbf needs a bucket of at least one packet (and a GSO super-packet, up to 64 KiB, on veth);
# a larger bucket lets the start of each message through at memory speed and skews short
# transfers. 256 KiB is a few ms at 1 Gbit/s and keeps the rate within ~1 % for MB messages.
BURST = "256kb"
QUEUE_LATENCY = "50ms"  # tbf drops what would wait longer than this: enough for one TCP window


def shape_link(dev: str, rate: str, burst: str, netns: str | None = None) -> None:
    """Put a token-bucket qdisc on ``dev``'s egress (tbf shapes only what a device sends)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    run_or_raise(
        *prefix,
        "tc",
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        burst,
        "latency",
        QUEUE_LATENCY,
    )


def shape_pc(room: Room, pc: PC, rate: str, burst: str = BURST) -> None:
    """Reshape both directions of ``pc``'s link to ``rate`` (a PC left at ``"100mbit"``)."""
    if pc not in room.pcs:
        raise ValueError(f"{pc.netns} is not a PC of room {room.tag}: pass one of room.pcs")
    shape_link(pc.host_veth, rate, burst)  # switch -> PC
    shape_link(pc.ifname, rate, burst, pc.netns)  # PC -> switch
