"""Lecture 9, model parallelism: a layer's neurons split across engines.

``tensor_parallel`` (column- and row-parallel linear layers, Megatron-style pairs) and ``hybrid``
(Krizhevsky 2014: data-parallel convolutions, model-parallel dense layers).
"""

__all__: list[str] = []
