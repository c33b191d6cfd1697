"""Lectures 4, 6, 8, 11, 12 and 13: the questions at the end of each lecture; numeric answers computed by the lecture's own formulas."""

from __future__ import annotations

from course_lib.collectives.mixing import gossip_matrix, spectral_gap
from course_lib.cost_model.alpha_beta import predict
from course_lib.parallel.large_batch.critical_batch import predicted_steps
from course_lib.parallel.sharded.audit import formula_values
from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes
from course_lib.teaching.bank_early import GIGABIT_MODEL, UNET_BYTES
from course_lib.teaching.questions import Numeric, Question, choice

__all__ = ["OTHERS"]


def _lecture4() -> list[Question]:
    return [
        Numeric("4.q1", "A parameter server with 4 workers and an 8.33 MB gradient: MB its link "
                "carries per step (in and out)?", 2 * 4 * UNET_BYTES / 1e6,
                "N gradients in, N weight copies out", unit="MB"),
        Numeric("4.q2", "The star allreduce of 8.33 MB on 4 ranks over the emulated Gigabit "
                "link: predicted ms?", 1e3 * predict("star_allreduce", UNET_BYTES, 4, GIGABIT_MODEL),
                "2 (N - 1)(alpha + n beta)", unit="ms"),
        Numeric("4.q3", "The same with the ring: how many times faster than the star?",
                predict("star_allreduce", UNET_BYTES, 4, GIGABIT_MODEL) / predict("ring_allreduce", UNET_BYTES, 4, GIGABIT_MODEL),
                "the ring sends n / N per step instead of n"),
        Numeric("4.q4", "Linear scaling: a learning rate of 0.1 at batch 64; the rate at batch "
                "512?", 0.1 * 512 / 64, "multiply by k when the batch grows k-fold"),
        choice("4.q5", "Data-parallel replicas equal one process trained on the global batch "
               "because ...", ("the mean of the shards' gradients is the global batch's "
               "gradient", "every replica starts from the same seed only", "the allreduce is "
               "exact in float32"), 0, "the gradient of a mean is the mean of the gradients"),
    ]  # fmt: skip


def _lecture6() -> list[Question]:
    return [
        Numeric("6.q1", "Gossip at distance 1 on 4 ranks (1/3 on self and each neighbour): the "
                "mixing matrix's spectral gap?", spectral_gap(gossip_matrix(4, 1)),
                "1 - the second-largest |eigenvalue|"),
        Numeric("6.q2", "The same on 8 ranks?", spectral_gap(gossip_matrix(8, 1)),
                "the gap shrinks as the ring grows"),
        Numeric("6.q3", "The allreduce's mixing matrix on 4 ranks has every entry equal to?",
                1 / 4, "W = J: everyone gets the mean"),
        choice("6.q4", "A mixing matrix must be doubly stochastic so that ...",
               ("the average of the replicas is kept", "every rank sends the same bytes",
                "the matrix is invertible"), 0, "columns summing to 1 keep the mean"),
        choice("6.q5", "A larger spectral gap means ...", ("faster consensus",
               "more bytes per step", "a slower link"), 0, "disagreement shrinks by 1 - gap"),
    ]  # fmt: skip


def _lecture8() -> list[Question]:
    return [
        Numeric("8.q1", "Local-SGD(16) for 320 steps with allreduce: how many averaging rounds?",
                320 / 16, "one every 16 steps", rel_tol=1e-9),
        Numeric("8.q2", "A dense allreduce of a 19 754-value model on 4 ranks: values each "
                "rank sends per round?", 2 * 3 / 4 * 19_754, "2 (N - 1) / N × P"),
        choice("8.q3", "The kit reproduces a paper's conclusion when ...",
               ("its interval over seeds agrees with the paper's direction",
                "its numbers equal the paper's", "one seed agrees"), 0,
               "different hardware: compare conclusions, with spreads"),
        choice("8.q4", "Gossip + sparsification sends fewer values than gossip; accuracy ...",
               ("has to be measured: it may fall", "is always the same",
                "always rises"), 0, "compression trades information for bytes"),
        choice("8.q5", "Why run several seeds?", ("a difference inside the seeds' spread is "
               "not a finding", "to use more cores", "to warm the caches"), 0,
               "seeds measure the noise of the experiment"),
    ]  # fmt: skip


def _lecture11() -> list[Question]:
    psi = 1e6
    return [
        Numeric("11.q1", "float32 Adam, no sharding (DDP): model-state bytes per parameter?",
                formula_bytes(0, 1, 1), "4 weights + 4 gradients + 8 Adam state", rel_tol=1e-9),
        Numeric("11.q2", "ZeRO stage 1 on 4 ranks, 1 M parameters, float32 Adam: MB of model "
                "state per rank?", formula_bytes(1, psi, 4) / 1e6, "8 Ψ + 8 Ψ / N", unit="MB"),
        Numeric("11.q3", "ZeRO stage 3 on 4 ranks: values each rank sends per step for Ψ = 1 M?",
                formula_values(3, int(psi), 4), "3 (N - 1) / N × Ψ"),
        Numeric("11.q4", "The ZeRO paper's 7.5 B-parameter model in mixed precision without "
                "sharding: GB of model state per GPU?", mixed_precision_bytes(0, 7.5e9, 64) / 1e9,
                "(2 + 2 + 12) Ψ", unit="GB"),
        choice("11.q5", "What does stage 2 shard beyond stage 1?", ("the gradients",
               "the weights", "the activations"), 0, "1: optimiser state; 2: + gradients; "
               "3: + weights"),
    ]  # fmt: skip


def _lecture12() -> list[Question]:
    return [
        Numeric("12.q1", "McCandlish et al.: S_min = 100 steps, B_crit = 64. Steps to target at "
                "B = 256?", float(predicted_steps(256.0, 100, 64)), "S_min (1 + B_crit / B)"),
        Numeric("12.q2", "The same at B = 16?", float(predicted_steps(16.0, 100, 64)),
                "below B_crit, steps grow fast"),
        Numeric("12.q3", "Linear scaling with 5 warm-up epochs to a rate of 0.8 from 0.1: the "
                "rate after 2 epochs (linear ramp)?", 0.1 + (0.8 - 0.1) * 2 / 5,
                "interpolate from the base rate"),
        choice("12.q4", "Beyond the critical batch, doubling the batch ...",
               ("barely cuts the steps to target", "halves the steps", "diverges always"), 0,
               "steps approach S_min"),
        choice("12.q5", "LARS scales each layer's step by ...", ("its weights' norm over its "
               "gradient's norm", "the batch size", "the number of layers"), 0,
               "a trust ratio per layer"),
    ]  # fmt: skip


def _lecture13() -> list[Question]:
    return [
        Numeric("13.q1", "An operator with 3 splittable dimensions, each split 1, 2 or 4 ways "
                "on 4 workers: how many (degree) configurations of the three, with a product "
                "of at most 4?", float(sum(1 for a in (1, 2, 4) for b in (1, 2, 4) for c in
                                          (1, 2, 4) if a * b * c <= 4)),
                "count the triples", rel_tol=1e-9),
        Numeric("13.q2", "Metropolis-Hastings with β = 1/ms: the probability of accepting a "
                "move 2 ms slower?", float(__import__("math").exp(-2)), "exp(-β Δt)"),
        choice("13.q3", "On a slow link, the rules of thumb prefer ...",
               ("pipelines: messages only at stage boundaries", "tensor parallelism",
                "no parallelism"), 0, "tensor parallelism communicates every layer"),
        choice("13.q4", "The simulator's job in the search is to ...",
               ("rank strategies correctly", "give exact step times", "train the model"), 0,
               "a search needs the order right"),
        choice("13.q5", "Memory first means ...", ("shard (ZeRO) or split until the model "
               "fits, then optimise speed", "buy more memory", "use float64"), 0,
               "a strategy that does not fit is not a strategy"),
    ]  # fmt: skip


OTHERS: dict[int, list[Question]] = {
    4: _lecture4(),
    6: _lecture6(),
    8: _lecture8(),
    11: _lecture11(),
    12: _lecture12(),
    13: _lecture13(),
}
