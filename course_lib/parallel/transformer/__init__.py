"""Lecture 14, transformer parallelism: a TinyGPT split by heads, by vocabulary and by sequence.

``heads`` (Megatron tensor parallelism of attention: heads split, column-parallel Q, K, V and a
row-parallel output), ``vocab`` (vocabulary-parallel embedding and cross-entropy), ``sequence``
(Korthikanti et al. 2022: the LayerNorm regions split along the sequence, each allreduce a
reduce-scatter + allgather), ``tp_gpt`` (the whole TinyGPT tensor- or sequence-parallel),
``ring`` (ring attention, Liu et al. 2023: online softmax, overlapped transfers, zig-zag blocks),
``ulysses`` (DeepSpeed-Ulysses: all-to-all between a sequence split and a head split),
``context`` (the whole TinyGPT context-parallel) and ``formulas`` (bytes and memory per rank).
"""

__all__: list[str] = []
