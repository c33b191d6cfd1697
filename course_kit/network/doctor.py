"""Lecture 3 and the instructor's guide: The doctor across PCs: a measured bandwidth and latency matrix of the lab, with its problems.

:func:`measure_network` groups the engines by PC (by their addresses, not host names: see
:mod:`course_lib.comm.rendezvous`), then measures, one link at a time so that no two transfers
share the switch, each PC towards its ring neighbour (the links a ring allreduce uses) and
each PC towards the PC the doctor runs on (the instructor's, ``"controller"``), with the probes
of :mod:`course_kit.network.probe`. :func:`network_problems` applies the rules (a slow
link, a PC on another subnet, a blocked port, a skewed clock) to any matrix, measured or given.

Kept whole: one report; the measurement fills the matrix that the rules read.
"""

from __future__ import annotations

import html
import ipaddress
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from course_kit.network import probe as network_probe
from course_lib.comm.rendezvous import describe_pc, group_by_pc

__all__ = ["CONTROLLER", "Link", "NetworkReport", "PCInfo", "measure_network", "network_problems"]

CONTROLLER = "controller"  # the PC the doctor runs on: the instructor's
SLOW_FRACTION = 0.5  # a link below half the typical link is a fault, not noise
# Timelines put events of different PCs on one time axis; a skew of several ms reorders a
# gloo message's send and receive (a 4 MB message takes ~35 ms at 1 Gbit/s).
MAX_SKEW = 0.005


@dataclass(frozen=True)
class PCInfo:
    """One PC: its label, addresses (``address/prefix``), engine ranks and clock offset."""

    label: str
    addresses: tuple[str, ...]
    ranks: tuple[int, ...]
    skew: float | None = None  # this PC's clock minus the controller's (s)
    skew_error: float | None = None  # the bound on that measurement's error (s)


@dataclass(frozen=True)
class Link:
    """A measured link ``src -> dst``: bandwidth (bytes/s), latency (s), or why it failed."""

    src: str
    dst: str
    bandwidth: float | None = None
    latency: float | None = None
    error: str | None = None


def _typical(links: list[Link]) -> float | None:
    """Return the bandwidth a good link has here: the 75th percentile of the measured ones."""
    # Not the median: if one PC of three is slow, half the ring's links touch it.
    rates = sorted(link.bandwidth for link in links if link.bandwidth)
    if not rates:
        return None
    return rates[min(len(rates) - 1, math.floor(0.75 * len(rates)))]


def network_problems(
    pcs: list[PCInfo],
    links: list[Link],
    slow_fraction: float = SLOW_FRACTION,
    max_skew: float = MAX_SKEW,
) -> list[str]:
    """Return the problems of a matrix: slow links, other subnets, blocked ports, skewed clocks."""
    problems = []
    typical = _typical(links)
    for link in links:
        if link.error is not None:
            problems.append(
                f"{link.src} -> {link.dst}: no TCP connection ({link.error}): a firewall on "
                f"{link.dst} blocks the ports above 1024 that gloo and the doctor use; open "
                "TCP 1024-65535 between the lab's PCs (see docs/instructor.md)"
            )
        elif typical and link.bandwidth < slow_fraction * typical:
            problems.append(
                f"{link.src} -> {link.dst}: slow link, {link.bandwidth / 1e6:.1f} MB/s where "
                f"links here reach {typical / 1e6:.1f} MB/s: check that PC's cable and switch "
                "port (`ethtool IFACE` shows 100Mb/s for a PC left at 100 Mbit/s)"
            )
    networks = {pc.label: {ipaddress.ip_interface(a).network for a in pc.addresses} for pc in pcs}
    votes = Counter(net for nets in networks.values() for net in nets)
    if votes and len(pcs) > 1:
        lab_net, count = votes.most_common(1)[0]
        for pc in pcs:
            if count > 1 and lab_net not in networks[pc.label]:
                problems.append(
                    f"{pc.label} is on another subnet ({', '.join(pc.addresses) or 'none'}) "
                    f"than the lab's {lab_net}: its traffic crosses a router; plug it into the "
                    "lab's switch (or VLAN) or give it an address in that subnet"
                )
    for pc in pcs:
        if pc.skew is not None and abs(pc.skew) - (pc.skew_error or 0.0) > max_skew:
            problems.append(
                f"{pc.label}: clock {pc.skew * 1e3:+.1f} ms off the controller's (more than "
                f"{max_skew * 1e3:g} ms): timelines across PCs would be out of order; turn on "
                "time sync (`timedatectl set-ntp true`, or `w32tm /resync` on Windows)"
            )
    return problems


@dataclass
class NetworkReport:
    """The measured matrix and its problems; shows as tables in a notebook, :meth:`heatmap`."""

    pcs: list[PCInfo]
    links: list[Link]
    nbytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Return True when no rule flagged anything."""
        return not self.problems

    def _link_rows(self) -> list[list[str]]:
        rows = []
        for link in self.links:
            if link.error is not None:
                rows.append([link.src, link.dst, "-", "-", f"BLOCKED: {link.error}"])
            else:
                flag = (
                    "slow"
                    if any(f"{link.src} -> {link.dst}: slow" in p for p in self.problems)
                    else ""
                )
                rows.append(
                    [
                        link.src,
                        link.dst,
                        f"{link.bandwidth / 1e6:.1f}",
                        f"{link.latency * 1e6:.0f}",
                        flag,
                    ]
                )
        return rows

    def _pc_rows(self) -> list[list[str]]:
        rows = []
        for pc in self.pcs:
            skew = "-" if pc.skew is None else f"{pc.skew * 1e3:+.2f} ± {pc.skew_error * 1e3:.2f}"
            rows.append([pc.label, ", ".join(pc.addresses), ",".join(map(str, pc.ranks)), skew])
        return rows

    LINK_HEAD = ("from", "to", "MB/s", "latency us", "flag")
    PC_HEAD = ("PC", "address", "ranks", "clock - controller's (ms)")

    def __str__(self) -> str:
        lines = []
        for head, rows in ((self.PC_HEAD, self._pc_rows()), (self.LINK_HEAD, self._link_rows())):
            widths = [
                max(len(h), *(len(r[j]) for r in rows)) if rows else len(h)
                for j, h in enumerate(head)
            ]
            lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
            lines.append("")
        lines.append(f"(links measured with {self.nbytes / 2**20:g} MiB messages, one at a time)")
        lines.append(
            "OK: every link is fast, open and in one subnet; clocks agree"
            if self.ok
            else "PROBLEMS:"
        )
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = []
        for head, rows in ((self.PC_HEAD, self._pc_rows()), (self.LINK_HEAD, self._link_rows())):
            ths = "".join(f"<th>{h}</th>" for h in head)
            trs = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
            )
            parts.append(f"<table><tr>{ths}</tr>{trs}</table>")
        verdict = "<p>OK: every link is fast, open and in one subnet; clocks agree</p>"
        if not self.ok:
            verdict = "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in self.problems)
            verdict += "</ul>"
        return "".join(parts) + verdict

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def matrix(self) -> tuple[list[str], list[list[float]]]:
        """Return the labels (controller first) and bandwidths in MB/s, ``[src][dst]``, NaN unmeasured."""
        labels = [CONTROLLER, *(pc.label for pc in self.pcs)]
        index = {label: i for i, label in enumerate(labels)}
        values = [[math.nan] * len(labels) for _ in labels]
        for link in self.links:
            values[index[link.src]][index[link.dst]] = (link.bandwidth or 0.0) / 1e6
        return labels, values

    def heatmap(self, ax: Any = None) -> Any:
        """Draw the bandwidth matrix (MB/s; blocked links 0, unmeasured blank); return the axes."""
        import matplotlib.pyplot as plt
        import numpy as np

        labels, values = self.matrix()
        if ax is None:
            size = 2.5 + 0.6 * len(labels)
            _, ax = plt.subplots(figsize=(size + 1.5, size))
        data = np.ma.masked_invalid(np.array(values))
        image = ax.imshow(data, cmap="viridis", vmin=0)
        ax.figure.colorbar(image, ax=ax, label="MB/s")
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlabel("to")
        ax.set_ylabel("from")
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", color="w")
        ax.set_title("measured bandwidth between PCs")
        return ax


def _label_pcs(places: list[dict[str, Any]], groups: list[int]) -> list[str]:
    """Return each PC's label: its host name, with its address when PCs share one (clones)."""
    first = [places[groups.index(g)] for g in range(max(groups) + 1)]
    hosts = [place["host"] for place in first]
    labels = []
    for place, host in zip(first, hosts, strict=True):
        addrs = [addr for _, addr, _ in place["interfaces"]]
        labels.append(host if hosts.count(host) == 1 else f"{host} ({addrs[0] if addrs else '?'})")
    return labels


def _pairs(n: int, all_pairs: bool) -> list[tuple[int, int]]:
    """Return the (sender, receiver) PC numbers to measure: a ring of ``n`` PCs, or all pairs."""
    if all_pairs:
        return [(a, b) for a in range(n) for b in range(n) if a != b]
    if n == 2:
        return [(0, 1)]
    return [(k, (k + 1) % n) for k in range(n)] if n > 2 else []


def measure_network(
    cluster: Any,
    nbytes: int = 8 * 2**20,
    repeats: int = 3,
    all_pairs: bool = False,
    timeout: float = 5.0,
    slow_fraction: float = SLOW_FRACTION,
    max_skew: float = MAX_SKEW,
) -> NetworkReport:
    """Measure the lab's links between PCs (ring neighbours, or ``all_pairs``) and to here.

    One engine per PC does the measuring (a PC that is also the doctor's is not measured
    towards itself); a link whose TCP connection fails within ``timeout``
    is reported blocked. Each transfer takes ``nbytes / bandwidth`` seconds ``repeats + 1``
    times: 8 MiB is ~70 ms at 1 Gbit/s and ~0.7 s at 100 Mbit/s.
    """
    if nbytes < 2**16 or repeats < 1:
        raise ValueError(
            f"nbytes={nbytes}, repeats={repeats}: use nbytes >= 65536 and repeats >= 1"
        )
    places = cluster.run(describe_pc, timeout=60)
    groups = group_by_pc(places)
    labels = _label_pcs(places, groups)
    first_rank = [groups.index(g) for g in range(len(labels))]
    engine = [cluster.client[cluster.ids_by_rank[r]] for r in first_rank]
    wait = timeout + 20 * (repeats + 1) * nbytes / 1e6 + 30  # 1 Mbit/s still finishes
    n = len(labels)
    pairs = _pairs(n, all_pairs)
    links, skews = [], {}
    ports = {b: engine[b].apply_sync(network_probe.open_sink) for b in {b for _, b in pairs}}
    try:
        for a, b in pairs:
            res = (
                engine[a]
                .apply_async(
                    network_probe.measure_to,
                    places[first_rank[b]]["interfaces"],
                    ports[b],
                    nbytes,
                    repeats,
                    timeout,
                )
                .get(timeout=wait)
            )
            links.append(_link(labels[a], labels[b], res))
    finally:
        for b, port in ports.items():
            engine[b].apply_sync(network_probe.close_sink, port)
    here_place = describe_pc()
    here = here_place["interfaces"]
    # An engine on the doctor's own PC would measure loopback: far faster than any cable, it
    # would make every real link look slow.
    mine = group_by_pc([*places, here_place])[-1]
    sink = network_probe.Sink()
    try:
        for k in (k for k in range(n) if k != mine):
            res = (
                engine[k]
                .apply_async(
                    network_probe.measure_to, here, sink.port, nbytes, repeats, timeout, True
                )
                .get(timeout=wait)
            )
            links.append(_link(labels[k], CONTROLLER, res))
            if "offset" in res:  # the controller's clock minus the PC's: negate for the PC's
                skews[k] = (-res["offset"], res["offset_error"])
    finally:
        sink.close()
    pcs = [
        PCInfo(
            label=labels[k],
            addresses=tuple(
                f"{addr}/{ipaddress.ip_network(f'0.0.0.0/{mask}').prefixlen}"
                for _, addr, mask in places[first_rank[k]]["interfaces"]
            ),
            ranks=tuple(r for r, g in enumerate(groups) if g == k),
            skew=skews.get(k, (None, None))[0],
            skew_error=skews.get(k, (None, None))[1],
        )
        for k in range(n)
    ]
    problems = network_problems(pcs, links, slow_fraction, max_skew)
    return NetworkReport(pcs, links, nbytes, problems)


def _link(src: str, dst: str, res: dict[str, Any]) -> Link:
    if "error" in res:
        return Link(src, dst, error=f"{res['address']}: {res['error']}")
    return Link(src, dst, bandwidth=res["bandwidth"], latency=res["latency"])
