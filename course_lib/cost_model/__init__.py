"""Lectures 3-4 (and 13's simulator): what communication should cost, and how well that prediction holds.

``alpha_beta`` (the latency-bandwidth model, fits, ping-pong) and ``calibration`` (alpha and beta
fitted on the collective itself). Lecture 13's execution simulator (source 003, FlexFlow):
``operators`` (the operator graph), ``configs`` (how each operator is split: samples, neurons,
inputs, image height, placement), ``op_costs`` (operator times measured once per machine, or from
FLOPs), ``engine_costs`` (the same shards timed on the engines, as many at once as a
configuration's workers), ``messages`` (transfers on links), ``task_graph``, ``simulator`` (event by event, with a
delta re-simulation) and ``search`` (Metropolis-Hastings, and exhaustive where the space is small). A data-parallel step's predicted time needs to know which
collective each exchange method pays (a fact of the method's class), so it lives one floor up,
in :mod:`course_lib.parallel.data_parallel.prediction`.
"""

__all__: list[str] = []
