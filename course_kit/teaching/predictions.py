"""No lecture (the lecturer's documents). Where each lecture asks for a prediction: the measuring cell (by a line of its source), the box, the reveal.

Each entry is ``(a line of the measuring cell, the prediction cell, the reveal cell)``:
``python -m course_kit.teaching.annotate`` puts the box before that cell and the reveal after
it. The reveal passes the measurement this run made and the lecture's formula's value
(``None`` where the lecture has no formula, only the reasoning in words).
"""

from __future__ import annotations

__all__ = ["PREDICTIONS"]


def _box(var: str, pid: str, question: str, **options: str) -> str:
    args = "".join(f", {k}={v}" for k, v in options.items())
    return f"{var} = Prediction({pid!r}, {question!r}{args})\n{var}"


PREDICTIONS: dict[int, list[tuple[str, str, str]]] = {
    0: [
        ('cluster.view.scatter("part", list(range(10)))',
         _box("p0a", "0.a", "`scatter` deals range(10) out to 4 engines: how many values does engine 0 get?",
              formula='"the first 10 mod 4 engines get one more than 10 // 4"'),
         'p0a.reveal(len(cluster.view.pull("part")[0]), 10 // 4 + 1)'),
        ("def allreduce_of_ranks():",
         _box("p0b", "0.b", "Each of 4 MPI ranks calls allreduce(its rank, SUM): what does rank 3 get?",
              formula='"0 + 1 + ... + (N - 1)"'),
         "p0b.reveal(mpi_cluster.run(allreduce_of_ranks)[3], sum(range(4)))"),
    ],
    1: [
        ("noise = []",
         _box("p1a", "1.a", "The mini-batch gradient's squared error at B = 64, as a share of its value at B = 1?",
              formula='"1/B, times (N - B)/(N - 1) without replacement"'),
         "p1a.reveal(float(noise[3] / noise[0]), float(fpc[3] / fpc[0] / 64))"),
        ("target, budget, seeds, sizes = 0.93, 30, (0, 1, 2), [8, 32, 128, 512]",
         _box("p1b", "1.b", "Which batch size reaches 93 % test accuracy in the fewest optimiser steps?",
              options='("8", "32", "128", "512")',
              formula='"steps fall as B grows, until B passes the critical batch (lecture 12)"'),
         'p1b.reveal(str(min((b for b in sizes if any(r["epochs"] is not None for r in study[b])), '
         'key=lambda b: np.median([r["steps"] for r in study[b] if r["epochs"] is not None]))))'),
    ],
    2: [
        ("TrainConfig(num_epochs=10, lr=0.01, momentum=0.9, batch_size=16)",
         _box("p2a", "2.a", "LeNet after 10 epochs on the digits: test accuracy (0-1)?",
              formula='"no formula: chance is 0.1"'),
         'p2a.reveal(round(history.last["test_accuracy"], 3))'),
        ("h = torch.zeros(5, 1, 8, 8)",
         _box("p2b", "2.b", "How many parameters has LeNet()?", formula='"sum of out*in*k*k + out per layer"'),
         "p2b.reveal(param_count(LeNet()))"),
    ],
    3: [
        ("def ring_vs_builtin(n):",
         _box("p3a", "3.a", "A ring allreduce on 4 ranks: how many times its buffer's bytes does each rank send?",
              unit='"x buffer"', formula='"2(N-1)/N"'),
         "p3a.reveal(cluster.run(ring_vs_builtin, 1_000_001)[0][1], 2 * 3 / 4)"),
        ('labels = {False: "MPI loopback (real)", True: GIGABIT.label}',
         _box("p3b", "3.b", "The ring allreduce of 4 MiB on 4 ranks over the emulated Gigabit link: ms?",
              unit='"ms"', formula='"2(N-1)(alpha + n/N beta), alpha and beta fitted by ping-pong"'),
         'p3b.reveal(1e3 * float(np.median(measured[True, "ring_allreduce"][-1])), '
         '1e3 * predict("ring_allreduce", sizes[-1], 4, models[True]))'),
    ],
    4: [
        ('ps = train_data_parallel(',
         _box("p4a", "4.a", "The parameter server on 4 ranks: how many times the gradient's bytes S does the server (rank 0) put on the wire per step?",
              unit='"x S"', formula='"(N - 1) S: the average goes back to each of the N - 1 workers"'),
         'p4a.reveal(round(ps.summary()[0]["wire_bytes"] / ps.gradient_bytes, 3), 4 - 1)'),
        ("emulated = {}",
         _box("p4b", "4.b", "The ring allreduce of this 8.3 MB gradient on 4 ranks over the emulated Gigabit link: its comm time per step, ms?",
              unit='"ms"', formula='"2(N-1)(alpha + S/N beta), the link model of lecture 3"'),
         'p4b.reveal(round(1e3 * float(np.mean([row["comm_s"] for row in emulated["ring"].summary()])), 1), '
         '1e3 * predict("ring_allreduce", ps.gradient_bytes, 4, LinkModel.from_link(GIGABIT)))'),
    ],
    5: [
        ('local = train_data_parallel(cluster, method="local_sgd"',
         _box("p5a", "5.a", "Local-SGD(4): the bytes rank 0 puts on the wire, as a share of bulk-synchronous training's?",
              formula='"1/H, one average every H = 4 steps"'),
         'p5a.reveal(sum(r["wire_bytes"] for r in local.records if r["rank"] == 0) / '
         'sum(r["wire_bytes"] for r in bsp.records if r["rank"] == 0), 1 / 4)'),
        ("asy = train_asynchronous(cluster, **common)",
         _box("p5b", "5.b", "The asynchronous server with 2 workers (one a straggler): mean staleness of the applied gradients?",
              unit='"updates"', formula='"W - 1 = 1 if both workers were equally fast"'),
         'p5b.reveal(float(np.mean([a["staleness"] for a in asy.applied])), 1)'),
    ],
    6: [
        ("values = np.array(cluster.run(gossip_rounds, 8))",
         _box("p6a", "6.a", "Engines start with 0, 1, 4, 9 and gossip 8 steps: what value does rank 0 hold then?",
              formula='"the mean of the start: every W is doubly stochastic, so the mean never moves"'),
         "p6a.reveal(round(float(values[0, -1]), 4), float(np.mean(values[:, 0])))"),
        ("def digits_960():",
         _box("p6b", "6.b", "Local-SGD(4) with gossip averaging (5 averagings in 20 steps): bytes per rank per averaging, in units of the weights' bytes S?",
              unit='"x S"', formula='"2 S at s = 1, S at s = 2 (both partners one rank), over s = 1, 2, 1, 2, 1"'),
         'p6b.reveal(round(float(np.mean([rec["wire_bytes"] for rec in runs["Local-SGD(4) + gossip"].records])) '
         "* 20 / 5 / (4 * sum(p.numel() for p in make_net().parameters())), 3), "
         "float(np.mean([len(set(gossip_partners(0, 4, s))) for s in gossip_distances(4, 5)])))"),
    ],
    7: [
        ('settings = {"topk": {"ratio": 0.01}',
         _box("p7a", "7.a", "Top-k keeping 1 % of the gradient (float32 values, int32 indices): the compression ratio?",
              formula='"4n / (8k)"'),
         'p7a.reveal(round(float(results["topk"][0]), 2), 4 / (8 * 0.01))'),
        ('print(f"share of int8 values that are 0',
         _box("p7b", "7.b", "int8 max-abs with the truncating cast: what share of this gradient's values become 0?",
              formula='"the share of |g| < max|g| / 127"'),
         "p7b.reveal(float(np.mean(q == 0)), float(np.mean(np.abs(g) < float(m) / 127)))"),
    ],
    9: [
        ("def train_both(steps=30, batch=64, lr=0.5):",
         _box("p9a", "9.a", "The tensor-parallel MLP on 4 ranks: what share of the whole model's parameters does rank 0 hold?",
              formula='"about 1/N (biases of the row layer are kept whole)"'),
         "p9a.reveal(round(results[0][3] / results[0][2], 4), 1 / 4)"),
        ("def bytes_per_step(batches):",
         _box("p9b", "9.b", "Krizhevsky's hybrid at batch 64 on 4 engines: its bytes per engine as a share of data parallelism's?",
              formula='"hybrid_bytes / data_parallel_bytes (the cost model)"'),
         "p9b.reveal(round(sum(measured[64].values()) / dp_measured, 3), "
         "sum(formula.values()) / dp_formula)"),
    ],
    10: [
        ("t = simulate(name, [Fraction(1)] * p, m)",
         _box("p10a", "10.a", "GPipe, p = 4 balanced stages, m = 8 micro-batches: what share of the step is the bubble?",
              formula='"(p-1)/(m+p-1)"'),
         'p10a.reveal(float(simulate("gpipe", [Fraction(1)] * 4, 8).bubble_fraction), bubble_formula(4, 8))'),
        ('formula = bubble_formula(4, 8) if name != "naive" else 3 / 4',
         _box("p10b", "10.b", "The same GPipe pipeline on 4 real engines (emulated compute, real messages): the measured bubble?",
              formula='"(p-1)/(m+p-1)"'),
         'p10b.reveal(round(Timeline.merge([r["timeline"] for r in runs["gpipe"]]).bubble_fraction, 4), '
         "bubble_formula(4, 8))"),
    ],
    12: [
        ("sweep = {}",
         _box("p12a", "12.a", "Linear scaling with 1 epoch of warm-up, 10 epochs on 4 engines: the test accuracy at B = 1024 (0-1)?",
              formula='"no formula: the rule holds while B stays below the critical batch (fitted below)"'),
         "p12a.reveal(round(sweep[1024], 3))"),
        ("GRID = [0.01, 0.04, 0.16, 0.64, 2.56]",
         _box("p12b", "12.b", "Each lr tuned: the steps to 95 % test accuracy at B = 256, as a share of the steps at B = 16?",
              formula='"16 / 256 with perfect scaling; S_min (1 + B_crit/B) predicts more above B_crit"'),
         "p12b.reveal(round(live[256].median / live[16].median, 3) if live[16] and live[256] else 'not reached', 16 / 256)"),
    ],
}  # fmt: skip

# Lectures 8, 11 and 13 (issue 36's engineer): a block of their own, merged into PREDICTIONS.
_LATER: dict[int, list[tuple[str, str, str]]] = {
    8: [
        ("size = 64 * 128 + 128 + 128 * 10 + 10  # the MLP's weights",
         _box("p8a", "8.a", "Local-SGD(4) + allreduce on 4 ranks: the values one rank sends per step, "
              "as a share of the MLP's size?",
              formula='"2(N-1)/N every p steps: 2(N-1)/(N p)"'),
         'p8a.reveal(round(next(r["values"] / (size * r["steps"]) for r in dense if r["number"] == 4), 4), '
         "2 * 3 / (4 * 4))"),
        ('names = ["float32", "float16", "int8", "int8+mgzip"',
         _box("p8b", "8.b", "Source 000's int8 through the star: float32's bytes on the wire over int8's?",
              formula='"4 bytes a value against 1"'),
         'p8b.reveal(round(next(r["ratio"] for r in rows000 if r["name"] == "int8"), 3), 4)'),
    ],
    11: [
        ("ROUNDS = 2  # interleaved rounds",
         _box("p11a", "11.a", "ZeRO-3 (float32 Adam) on 4 ranks: the model state each rank holds after a step, "
              "in bytes per parameter of the whole model?",
              unit='"bytes/param"', formula='"16 / N"'),
         'p11a.reveal(round(next(r["ledger_settled_bytes"] for r in runs[3].records if r["rank"] == 0) '
         "/ psi, 3), 16 / 4)"),
        ('POLICIES = {"float32": (f32, f32)',
         _box("p11b", "11.b", "The same ZeRO-3 gathering and reducing in bfloat16 on 4 ranks: "
              "bytes each rank sends per parameter per step?",
              unit='"bytes/param"', formula='"(N-1)/N (2p + r), p = r = 2 bytes"'),
         'p11b.reveal(round(next(r["bytes_sent"] for r in kit_mixed["bf16, reduce in bf16"].records '
         'if r["rank"] == 0) / psi, 3), mixed_wire_bytes(psi, 4, 2, 2) / psi)'),
    ],
    13: [
        ("best, best_time, size = exhaustive(small, space)",
         _box("p13a", "13.a", "The MLP's search space on 2 workers (degrees 1 and 2): how many strategies "
              "does the exhaustive search simulate?",
              formula='"the product over the operators of each one\'s number of configurations"'),
         "p13a.reveal(size, int(np.prod([len(c) for c in space])))"),
        ("per_run = statistics.median(",
         _box("p13b", "13.b", "How many times faster is simulating one strategy than running it on the "
              "engines (a warm-up and 3 steps)?",
              unit='"x"', formula='"FlexFlow (paper): about three orders of magnitude"'),
         "p13b.reveal(round(per_run / (walk.seconds / walk.iterations)), 1000)"),
    ],
}  # fmt: skip
PREDICTIONS.update(_LATER)

# Lectures 14 and 15 (the transformer lectures), a block of their own as well.
_TRANSFORMER: dict[int, list[tuple[str, str, str]]] = {
    14: [
        ('tp, sp = rank0["tensor"], rank0["sequence"]',
         _box("p14a", "14.a", "Sequence parallelism on t = 4 ranks: by what factor does it divide the "
              "LayerNorm regions' saved bytes, against tensor parallelism?",
              unit='"x"', formula='"t: each rank keeps T/t tokens of those regions"'),
         'p14a.reveal(results[4][0]["tensor"]["layernorm"] / results[4][0]["sequence"]["layernorm"], 4)'),
        ("work = {lay: cluster.run(ring_case, 64, lay)",
         _box("p14b", "14.b", "Causal ring attention on 4 ranks in contiguous blocks: how many times rank "
              "0's scores does rank 3 compute?",
              unit='"x"', formula='"rank r meets r + 1 blocks of keys"'),
         'p14b.reveal(work["contiguous"][3]["scores"] / work["contiguous"][0]["scores"], 4)'),
    ],
    15: [
        ("rows, width = 8, 64",
         _box("p15a", "15.a", "An all-to-all of an 8192-byte buffer on 4 ranks: how many bytes does each "
              "rank send?",
              unit='"B"', formula='"(N-1)/N of the buffer: every block but one\'s own"'),
         'p15a.reveal(cluster.run(three_all_to_alls, rows, width)[0]["pairwise"][1], 3 * buffer_bytes // 4)'),
        ("for f in (0.5, 1.0, 1.25, 2.0):",
         _box("p15b", "15.b", "32 tokens, k = 2, 4 experts, capacity factor 2.0 (the loop's last): how many "
              "slots has each expert?",
              formula='"ceil(f k T / E)"'),
         "p15b.reveal(r.capacity, int(np.ceil(2.0 * 2 * 32 / 4)))"),
    ],
}  # fmt: skip
PREDICTIONS.update(_TRANSFORMER)
