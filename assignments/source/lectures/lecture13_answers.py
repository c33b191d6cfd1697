"""Instructor answers to lecture 13's exercises (choosing a strategy); see the README beside."""

from __future__ import annotations

import math

__all__ = ["my_accept", "my_column_messages", "my_pipeline_time"]


def my_column_messages(batch, n_in, n_out, world_size):
    """Exercise 13.1: the messages of a column-parallel layer fed by a sample split."""
    ### BEGIN SOLUTION
    # every worker needs the whole input; worker h holds rows h*B/N .. (h+1)*B/N - 1
    rows = 4 * (batch // world_size) * n_in  # float32 bytes of one worker's rows
    pairs = [(h, c) for h in range(world_size) for c in range(world_size) if h != c]
    forward = {(h, c): rows for h, c in pairs}  # h's rows to every other worker c
    # backward: c's (partial) gradient of h's rows goes back to h, which sums them
    backward = {(c, h): rows for h, c in pairs}
    return forward, backward
    ### END SOLUTION


def my_accept(t_cur, t_new, beta, rng):
    """Exercise 13.2: accept a proposal with probability min(1, exp(-beta (t_new - t_cur)))."""
    ### BEGIN SOLUTION
    dt = t_new - t_cur
    return dt <= 0 or rng.random() < math.exp(-beta * dt)
    ### END SOLUTION


def my_pipeline_time(batch, n_in, n_out, costs, link):
    """Exercise 13.3: the linear layer on worker 0, the loss on worker 1, one step."""

    ### BEGIN SOLUTION
    def message(nbytes):
        return link.alpha + nbytes * link.beta

    (f0, b0), (f1, b1) = costs["linear"], costs["loss"]
    samples = message(4 * (batch // 2) * n_in)  # worker 1's half of the samples, to worker 0
    # the labels go 0 -> 1 at the same time on the other direction's link: not on the path
    activations = message(4 * batch * n_out)  # the linear layer's output, 0 -> 1
    gradient = message(4 * batch * n_out)  # dL/d(output), 1 -> 0
    return samples + f0 + activations + f1 + b1 + gradient + b0
    ### END SOLUTION
