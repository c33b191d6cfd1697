"""Lecture 11: Sharded data parallelism (ZeRO stages 1-3, FSDP) written on the kit's Communicator.

``train_data_parallel(cluster, ..., method="zero2")`` (or ``method=Zero3()``) trains with the
optimiser state, the gradients and (stage 3) the weights cut into one shard per rank; each
step's record carries the rank's memory ledger (:mod:`.ledger`), and :mod:`.audit` checks the
bytes its communicator counted against the formulas.
"""

from course_lib.parallel.sharded.fsdp_unit import Zero3
from course_lib.parallel.sharded.zero import Zero0, Zero1, Zero2, ZeroExchange

__all__ = ["SHARDED_EXCHANGES", "Zero0", "Zero1", "Zero2", "Zero3", "ZeroExchange"]

#: The built-in sharded methods, registered by name in ``exchanges.registry``.
SHARDED_EXCHANGES = (Zero0, Zero1, Zero2, Zero3)
