"""Lecture 10, layer (pipeline) parallelism: stages on engines, micro-batches, the bubble.

``schedule`` (naive, GPipe and 1F1B as lists of forward / backward tasks, and their simulation),
``interleaved`` (interleaved 1F1B: v model chunks per rank, a v-th of the bubble, v times the
messages) and ``pipeline`` (running a schedule on real stages over the communicator).
"""

__all__: list[str] = []
