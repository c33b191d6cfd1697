"""Lecture 8: Source 001's ten configurations: Local-SGD 1 / 4 / 16 / 32 x allreduce / gossip / sparse gossip.

Source 001 (MSU coursework, C++ and MPI) trained one small CNN in ten configurations and
measured accuracy, total time, communication time and synchronisation time (communication +
waiting). This module holds the configurations by the source's numbering, runs one of them on
the engines with :func:`~course_lib.parallel.data_parallel.train.train_data_parallel`, turns a run into
a row of figures, and prints and plots the rows beside the source's conclusions::

    rows = [run_configuration(cluster, k, config=config, link=GIGABIT) for k in range(1, 11)]
    print(configurations_table(rows)); plot_configurations(rows); print(compare_with_paper(rows))

**Values sent** (per rank, whole run) are float32 weights or gradients on the wire: gossip's
messages as sent; an allreduce as its backend's algorithm moves it (the step records'
``wire_bytes``, :mod:`course_lib.comm.wire`: gloo's ring, $2(N-1)/N$ of the vector per rank);
sparse gossip the values it sent to each partner (their int32 indices and counts are in
``bytes``, not in ``values``). The presence flags that gradient gossip sends beside the values
(one per tensor, so that a tensor no partner has a gradient for stays untouched) are in
``bytes`` only. Source 001's "95 % fewer values" counts values the same way.

Kept whole: one table, source 001's ten configurations: run, row, comparison, plot.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import partial
from typing import Any

from matplotlib.figure import Figure

from course_lib.papers.seeds import agreement, judge, paired, spread

__all__ = [
    "CONFIGURATIONS",
    "GRADIENT_THRESHOLD",
    "PAPER_CONCLUSIONS",
    "WEIGHT_THRESHOLD",
    "Configuration",
    "SEED_CLAIMS",
    "compare_seeds_with_paper",
    "compare_with_paper",
    "configurations_table",
    "seed_claims",
    "seeds_table",
    "plot_configurations",
    "predict_values_sent",
    "row_from_result",
    "run_configuration",
]

#: Algorithm 3 at p = 1 (gradients): components with |g| above this travel. Source 001 found
#: t = 1 best for its CNN; the digits MLP's gradients are far smaller, so its t is smaller.
GRADIENT_THRESHOLD = 0.01
#: p > 1 (weights): only weights that moved more than this since the last averaging travel.
#: This is the kit's interpretation, not the source's: Algorithm 3 thresholds gradients, and
#: source 001 does not say how configurations 6 and 9 combine it with averaging weights.
WEIGHT_THRESHOLD = 0.001


@dataclass(frozen=True)
class Configuration:
    """One of source 001's configurations: Local-SGD(``period``) with ``averaging``."""

    number: int
    period: int
    averaging: str  # "allreduce", "gossip" or "gossip_sparse"

    @property
    def label(self) -> str:
        """Return e.g. ``"9: Local-SGD(16) + gossip + sparsification"``."""
        how = {
            "allreduce": "allreduce",
            "gossip": "gossip",
            "gossip_sparse": "gossip + sparsification",
        }[self.averaging]
        return f"{self.number}: Local-SGD({self.period}) + {how}"

    def options(self) -> dict[str, Any]:
        """Return the ``train_data_parallel`` keywords that run this configuration."""
        opts: dict[str, Any] = {
            "method": "local_sgd",
            "period": self.period,
            "averaging": self.averaging,
        }
        if self.averaging == "gossip_sparse":
            opts["threshold"] = GRADIENT_THRESHOLD if self.period == 1 else WEIGHT_THRESHOLD
        return opts


#: The ten configurations in source 001's numbering (DIGEST, "001", Experiments).
CONFIGURATIONS: dict[int, Configuration] = {
    k: Configuration(k, period, averaging)
    for k, (period, averaging) in enumerate(
        [(p, a) for p in (1, 4, 16) for a in ("allreduce", "gossip", "gossip_sparse")]
        + [(32, "allreduce")],
        start=1,
    )
}

#: What source 001 reported (its conclusions, CIFAR-10 / -100 CNN on two MPI clusters): the
#: paper's figures, never the kit's. Ranges are (low, high); "x" = times less communication time.
PAPER_CONCLUSIONS: dict[str, dict[str, Any]] = {
    "best": {"configuration": 9, "comm_less_x": 40.0, "accuracy_cost_points": (1.0, 3.0),
             "text": "configuration 9: communication ~40x faster on average, 1-3 % accuracy lost"},
    "local_sgd": {"accuracy_cost_points": (2.0, 4.0),
                  "text": "Local-SGD speeds communication up in proportion to p, 2-4 % accuracy "
                          "lost (much more at large p)"},
    "gossip": {"comm_less_x": (2.0, 5.0), "accuracy_cost_points": (2.0, 2.0),
               "text": "gossip: communication 2-5x faster, ~2 % accuracy lost"},
    "sparsification": {"comm_less_x": (2.0, 10.0),
                       "text": "sparsification on top of gossip: a further 2-10x (up to 20x); "
                               "costs 1-2 % more at p = 1, almost nothing at p > 1"},
    "whole_run": {"text": "fast interconnect (Polus): no real gain; Lomonosov-2: whole training "
                          "2-3x faster. The methods pay off on slow networks."},
}  # fmt: skip


def _check_number(number: int) -> Configuration:
    if number not in CONFIGURATIONS:
        raise ValueError(f"configuration {number!r}: source 001 numbers its configurations 1..10")
    return CONFIGURATIONS[number]


def row_from_result(result: Any, number: int) -> dict[str, Any]:
    """Return one configuration's figures from a ``DataParallelResult`` (sums over its steps).

    ``acc``: test accuracy after the last epoch, mean over the replicas (they differ under
    Local-SGD and gossip); ``total``: rank 0's training time (evaluation passes included);
    ``comm``: communication seconds per rank (exchange + averaging); ``sync``: ``comm`` plus
    waiting, as source 001 defines it; ``bytes``: bytes each rank put on the wire (the records'
    ``wire_bytes``: point-to-point as sent, an allreduce by its backend's algorithm);
    ``values``: float32 values on the wire per rank (see the module's note).
    """
    conf = _check_number(number)
    n, records = result.world_size, result.records
    per_rank = lambda key: sum(r.get(key, 0) for r in records) / n  # noqa: E731
    comm = per_rank("comm_s") + per_rank("sync_s")
    steps = [r for r in records if r["rank"] == 0]
    end = max(v[1] for k, v in steps[-1].items() if k.endswith("_at"))
    wired = all("wire_bytes" in r for r in records)  # records made before wire bytes: a ring
    ring = per_rank("bytes_sent") + per_rank("collective_bytes") * 2 * (n - 1) / n
    sent = per_rank("wire_bytes") if wired else ring
    if conf.averaging == "allreduce":  # all it sends is the weights, by the backend's algorithm
        values = sent / 4
    elif conf.averaging == "gossip":  # each message: the gradient, then its presence flags
        gradient, flags = getattr(result, "gradient_bytes", 0), getattr(result, "flag_bytes", 0)
        values = per_rank("bytes_sent") / 4 * (gradient / (gradient + flags) if flags else 1.0)
    else:  # each partner message: an int64 count, then (int32 index, float32 value) pairs
        values = sum(_sparse_values_on_wire(r) for r in records) / n
    return {
        "number": number,
        "period": conf.period,
        "averaging": conf.averaging,
        "acc": statistics.mean(h.epochs[-1]["test_accuracy"] for h in result.histories),
        "total": end - steps[0]["compute_at"][0],
        "comm": comm,
        "sync": comm + per_rank("wait_s"),
        "bytes": sent,
        "values": values,
        "steps": len(steps),
        "link": result.label,
    }


def _sparse_values_on_wire(record: dict[str, Any]) -> float:
    """Values one rank put on the wire in one sparse step: k per partner message."""
    k = record.get("values_sent", 0)
    pairs = k + record.get("flags_sent", 0)  # the presence flags set travel as pairs too
    messages = record.get("bytes_sent", 0) / (8 + 8 * pairs)  # 8 + 8 bytes a pair per message
    return k * round(messages)


def run_configuration(
    cluster: Any,
    number: int,
    *,
    config: Any,
    model: Any = None,
    dataset: Any = None,
    test_set: Any = None,
    link: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run source 001's configuration ``number`` on the engines; return its row of figures.

    Defaults: the digits MLP 64 -> 128 -> 10 (the offline stand-in for source 001's CNN), the
    digits training set, the digits test set. ``kwargs`` go to ``train_data_parallel``.
    """
    from course_lib.data.digits import load_digits
    from course_lib.parallel.data_parallel.train import train_data_parallel
    from course_lib.training.models import MLP

    conf = _check_number(number)
    result = train_data_parallel(
        cluster,
        model=model or partial(MLP, 64, (128,)),
        dataset=dataset or load_digits,
        config=config,
        test_set=test_set if test_set is not None else load_digits(train=False),
        link=link,
        **conf.options(),
        **kwargs,
    )
    return row_from_result(result, number)


def predict_values_sent(
    averaging: str, size: int, world_size: int, steps: int, period: int = 1
) -> float:
    """Predict the float32 values one rank sends in ``steps`` steps of a dense scheme.

    ``averaging="allreduce"``: ``steps // period`` allreduces of ``size`` values, each moving
    $2(N-1)/N$ of the vector per rank in a ring. ``"gossip"``: ``steps // period`` gossip steps
    (every step for ``period=1``) at distances s = 1, 2, .., P/2, 1, ..; a step sends the vector
    to both partners, once when they are the same rank (s = P/2, or P = 2). Sparse gossip depends
    on the data, so it has no prediction.
    """
    from course_lib.collectives.gossip import gossip_partners
    from course_lib.collectives.mixing import gossip_distances

    if averaging not in ("allreduce", "gossip"):
        raise ValueError(
            f"averaging={averaging!r}: predictable are 'allreduce' and 'gossip' "
            "(sparse gossip sends what its threshold lets through)"
        )
    syncs, n = steps // period, world_size
    if n == 1:
        return 0.0
    if averaging == "allreduce":
        return syncs * size * 2 * (n - 1) / n
    messages = sum(len(set(gossip_partners(0, n, s))) for s in gossip_distances(n, syncs))
    return float(messages * size)


def _less(rows: list[dict[str, Any]], key: str, row: dict[str, Any]) -> float:
    base = next(r for r in rows if r["number"] == 1)
    return base[key] / max(row[key], 1e-12)


def configurations_table(rows: list[dict[str, Any]]) -> str:
    """Return the rows as text, with values and communication time against configuration 1."""
    if not any(r["number"] == 1 for r in rows):
        raise ValueError("the table compares with configuration 1: run configuration 1 too")
    lines = [
        f"{'#':>2} {'p':>3} {'averaging':<14} {'test acc':>8} {'total s':>8} {'comm s':>7} "
        f"{'sync s':>7} {'values sent':>12} {'fewer':>6} {'comm less':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['number']:>2} {r['period']:>3} {r['averaging']:<14} {r['acc']:>8.3f} "
            f"{r['total']:>8.2f} {r['comm']:>7.3f} {r['sync']:>7.3f} {r['values']:>12.0f} "
            f"{_less(rows, 'values', r):>5.1f}x {_less(rows, 'comm', r):>8.1f}x"
        )
    return "\n".join(lines)


def compare_with_paper(rows: list[dict[str, Any]], number: int = 9) -> str:
    """Return what this run measured for configuration ``number`` beside the paper's figure."""
    base = next((r for r in rows if r["number"] == 1), None)
    row = next((r for r in rows if r["number"] == number), None)
    if base is None or row is None:
        raise ValueError(f"compare_with_paper needs configurations 1 and {number} in the rows")
    paper = PAPER_CONCLUSIONS["best"]
    low, high = paper["accuracy_cost_points"]
    cost = 100 * (base["acc"] - row["acc"])
    values_x, comm_x = _less(rows, "values", row), _less(rows, "comm", row)
    where = "within" if low <= cost <= high else ("below" if cost < low else "above")
    return (
        f"kit (measured, this run): configuration {number} sent {values_x:.0f}x fewer values and "
        f"spent {comm_x:.1f}x less time communicating than configuration 1, "
        f"{'losing' if cost >= 0 else 'gaining'} {abs(cost):.1f} accuracy points "
        f"({100 * base['acc']:.1f} % -> {100 * row['acc']:.1f} %)\n"
        f"paper (source 001's figure): configuration {paper['configuration']}, communication "
        f"~{paper['comm_less_x']:.0f}x faster at {low:g}-{high:g} points\n"
        f"values: {'more' if values_x > paper['comm_less_x'] else 'less'} than the paper's "
        f"~{paper['comm_less_x']:.0f}x; accuracy cost {where} the paper's {low:g}-{high:g} points"
    )


#: The paper's claims judged over seeds: (what, configuration, compared with, figure, low, high).
#: figure "cost": accuracy points lost against the compared one, seed by seed; "comm": its
#: communication time divided by this one's. Two ranges are the kit's reading of words: "~2 %"
#: as 1.5-2.5 points (the rounding of ~2), "almost nothing" as at most 1 point either way; "~40x"
#: is read as reached at 40x or more.
SEED_CLAIMS: tuple[tuple[str, int, int, str, float, float], ...] = (
    ("best: 9 vs 1, accuracy cost (paper: 1-3 points)", 9, 1, "cost", 1.0, 3.0),
    ("best: 9 vs 1, communication time less (paper: ~40x)", 9, 1, "comm", 40.0, math.inf),
    ("Local-SGD(4), 4 vs 1, accuracy cost (paper: 2-4)", 4, 1, "cost", 2.0, 4.0),
    ("Local-SGD(16), 7 vs 1, accuracy cost (paper: 2-4)", 7, 1, "cost", 2.0, 4.0),
    ("Local-SGD(32), 10 vs 1, accuracy cost (paper: 2-4, more at large p)", 10, 1, "cost",
     2.0, math.inf),
    ("gossip, 2 vs 1, accuracy cost (paper: ~2)", 2, 1, "cost", 1.5, 2.5),
    ("gossip, 2 vs 1, communication time less (paper: 2-5x)", 2, 1, "comm", 2.0, 5.0),
    ("sparsification at p = 1, 3 vs 2, accuracy cost (paper: 1-2)", 3, 2, "cost", 1.0, 2.0),
    ("sparsification at p = 4, 6 vs 5, accuracy cost (paper: almost nothing)", 6, 5, "cost",
     -1.0, 1.0),
    ("sparsification at p = 16, 9 vs 8, accuracy cost (paper: almost nothing)", 9, 8, "cost",
     -1.0, 1.0),
    ("sparsification at p = 1, 3 vs 2, communication time less (paper: 2-10x)", 3, 2, "comm",
     2.0, 10.0),
)  # fmt: skip


def _by_number(runs: list[list[dict[str, Any]]], number: int) -> list[dict[str, Any]]:
    try:
        return [next(r for r in rows if r["number"] == number) for rows in runs]
    except StopIteration:
        raise ValueError(f"every seed's rows need configuration {number}") from None


def seed_claims(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Return each of :data:`SEED_CLAIMS` measured over ``runs`` (one list of rows per seed).

    Each: ``what``, ``number`` / ``base`` / ``figure`` (as in the table), ``kit`` (a :class:`~course_lib.papers.seeds.Spread`, paired by seed),
    ``low`` / ``high`` (the paper's range), ``where`` (:func:`~course_lib.papers.seeds.judge`)
    and ``verdict`` (:func:`~course_lib.papers.seeds.agreement`).
    """
    claims = []
    for what, k, base, figure, low, high in SEED_CLAIMS:
        mine, theirs = _by_number(runs, k), _by_number(runs, base)
        if figure == "cost":
            kit = paired([r["acc"] for r in theirs], [r["acc"] for r in mine], scale=100)
        else:
            kit = spread(
                [b["comm"] / max(r["comm"], 1e-12) for b, r in zip(theirs, mine, strict=True)]
            )
        claims.append(
            {"what": what, "number": k, "base": base, "figure": figure, "kit": kit,
             "low": low, "high": high,
             "where": judge(kit, low, high), "verdict": agreement(kit, low, high)}
        )  # fmt: skip
    return claims


def compare_seeds_with_paper(runs: list[list[dict[str, Any]]]) -> str:
    """Return each claim of source 001 beside the kit's figure over seeds, with its verdict."""
    lines = [f"over {len(runs)} seeds (mean +- sd [min to max]; verdict from the 95 % interval):"]
    for c in seed_claims(runs):
        unit = "points lost" if "cost" in c["what"] else "times less"
        lines.append(f"  {c['what']}\n    kit ({unit}): {c['kit']} -> {c['verdict']}")
    return "\n".join(lines)


def seeds_table(runs: list[list[dict[str, Any]]]) -> str:
    """Return one line per configuration: accuracy, values fewer and comm less, over seeds."""
    lines = [
        f"{'#':>2} {'p':>3} {'averaging':<14} {'test acc % (mean +- sd [min to max])':<40} "
        f"{'fewer values':>12} {'fewer bytes':>11} {'comm less':>16}"
    ]
    base = _by_number(runs, 1)
    for number in sorted({r["number"] for rows in runs for r in rows}):
        mine = _by_number(runs, number)
        acc = spread([r["acc"] for r in mine], scale=100)
        fewer = spread(
            [b["values"] / max(r["values"], 1e-12) for b, r in zip(base, mine, strict=True)]
        )
        less = spread([b["comm"] / max(r["comm"], 1e-12) for b, r in zip(base, mine, strict=True)])
        nbytes = spread([b["bytes"] / max(r["bytes"], 1) for b, r in zip(base, mine, strict=True)])
        lines.append(
            f"{number:>2} {mine[0]['period']:>3} {mine[0]['averaging']:<14} "
            f"{acc.format(1):<40} {fewer.mean:>11.1f}x {nbytes.mean:>10.1f}x {less.mean:>6.1f}x +- {less.sd:>4.1f}"
        )
    return "\n".join(lines)


def plot_configurations(rows: list[dict[str, Any]]) -> Figure:
    """Plot values sent vs accuracy (with the paper's best) and comm / sync time per configuration."""
    import matplotlib.pyplot as plt

    colors = {"allreduce": "tab:blue", "gossip": "tab:orange", "gossip_sparse": "tab:green"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = next(r for r in rows if r["number"] == 1)
    for r in rows:
        left.scatter(r["values"], 100 * r["acc"], color=colors[r["averaging"]], s=40)
        below = r["averaging"] == "gossip_sparse"  # 9 sits next to 10: label it underneath
        left.annotate(
            str(r["number"]),
            (r["values"], 100 * r["acc"]),
            xytext=(4, -10 if below else 3),
            textcoords="offset points",
            fontsize=8,
        )
    paper = PAPER_CONCLUSIONS["best"]
    low, high = paper["accuracy_cost_points"]
    left.errorbar(
        base["values"] / paper["comm_less_x"],
        100 * base["acc"] - (low + high) / 2,
        yerr=(high - low) / 2,
        fmt="*",
        color="k",
        ms=10,
        capsize=3,
        label="paper's figure for 9: ~40x less, 1-3 points",
    )
    for name, color in colors.items():
        left.scatter([], [], color=color, label=f"{name} (measured)")
    left.set(
        xscale="log",
        xlabel="float32 values sent per rank (log)",
        ylabel="test accuracy %",
        title="values sent vs accuracy\n(numbers: source 001's configurations)",
    )
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    x = range(len(rows))
    right.bar(x, [r["sync"] for r in rows], color="tab:gray", label="sync = comm + waiting")
    right.bar(
        x,
        [r["comm"] for r in rows],
        color=[colors[r["averaging"]] for r in rows],
        label="communication",
    )
    right.set_xticks(list(x), [str(r["number"]) for r in rows])
    right.set(
        xlabel="configuration",
        ylabel="seconds per rank (measured)",
        title=f"communication and synchronisation\n{rows[0]['link']}",
    )
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig
