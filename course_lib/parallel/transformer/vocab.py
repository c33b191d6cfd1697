"""Lecture 14: the vocabulary split over ranks: embedding rows and the loss's classes
(Shoeybi et al. 2019, "Megatron-LM", section 3: "parallelize the input embedding weight matrix
along the vocabulary dimension" and fuse the output layer with the cross-entropy).

Rank r holds the rows ``bounds[r]`` of the token embedding and of the output layer. The
embedding looks up only the tokens of its own rows (zeros for the others) and the sum over
ranks is the full lookup. The output layer gives each rank the logits of its own classes, never
the (batch, T, vocab) whole: the cross-entropy needs only three numbers per token from the
other ranks — the largest logit (for a stable exponent), the sum of exponentials and the
target's logit — so three allreduces of batch x T floats replace an allgather of
batch x T x vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.comm.communicator import Communicator

__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_lookup"]


def vocab_parallel_lookup(
    idx: torch.Tensor, weight: torch.Tensor, bounds: tuple[int, int]
) -> torch.Tensor:
    """Return this rank's part of the embedding of ``idx``: its rows ``bounds``, zeros elsewhere.

    The sum over ranks (a ``g`` operator: allreduce, or reduce-scatter with sequence
    parallelism) is the full lookup. ``weight`` holds the rows ``bounds[0]..bounds[1]-1``.
    """
    a, b = bounds
    inside = (idx >= a) & (idx < b)
    rows = F.embedding(torch.where(inside, idx - a, torch.zeros_like(idx)), weight)
    return rows * inside.unsqueeze(-1).to(rows.dtype)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy per token from the logits of this rank's classes; three allreduces forward."""

    @staticmethod
    def forward(ctx, logits, target, comm, bounds):
        a, b = bounds
        # 1: the largest logit over every rank's classes, so that exp() cannot overflow
        top = comm.allreduce(logits.detach().amax(-1).contiguous(), op="max")
        z = logits - top.unsqueeze(-1)
        inside = (target >= a) & (target < b)
        local = torch.where(inside, target - a, torch.zeros_like(target))
        # 2: the target's logit lives on one rank: the others contribute 0
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside.to(z.dtype)
        picked = comm.allreduce(picked.contiguous())
        # 3: the softmax's denominator, summed over every rank's classes
        e = z.exp()
        total = comm.allreduce(e.sum(-1).contiguous())
        ctx.save_for_backward(e / total.unsqueeze(-1), inside, local)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        # d loss / d logit_c = softmax_c - [c == target]: each rank's own classes, no traffic
        softmax, inside, local = ctx.saved_tensors
        out = softmax.clone()
        hit = out.gather(-1, local.unsqueeze(-1)) - inside.unsqueeze(-1).to(out.dtype)
        out.scatter_(-1, local.unsqueeze(-1), hit)
        return out * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, comm: Communicator, bounds: tuple[int, int]
) -> torch.Tensor:
    """Return the cross-entropy of every token (shape of ``target``), equal on every rank.

    ``logits`` (..., classes ``bounds[0]..bounds[1]-1``) are this rank's; ``target`` holds the
    global class of each token. Every rank of ``comm`` calls it with the same ``target``.
    """
    return _VocabParallelCrossEntropy.apply(logits, target, comm, tuple(bounds))
