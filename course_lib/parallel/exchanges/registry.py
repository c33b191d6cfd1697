"""Lectures 4-8: Gradient-exchange methods by name: the table of the kit's own methods, a convenience.

::

    make_exchange("ring")                          # the kit's ring allreduce after backward
    make_exchange("bucketed", bucket_bytes=4096)   # overlapped with backward
    make_exchange(MyMethod())                      # your own GradientExchange: used as it is

Every entry is a :class:`~course_lib.parallel.exchanges.base.GradientExchange` subclass; options are
its constructor's keyword arguments, validated there. The table is the by-name convenience for
the kit's own methods: a method of your own needs no entry, pass an instance to
``train_data_parallel(method=...)``.
"""

from __future__ import annotations

from typing import Any

from course_lib.parallel.exchanges.base import (
    BuiltinAllreduce,
    GradientExchange,
    NaiveAllreduce,
    RingAllreduce,
)
from course_lib.parallel.exchanges.buckets import BucketedAllreduce
from course_lib.parallel.exchanges.compressed import CompressedExchange
from course_lib.parallel.exchanges.compressed_ddp import CompressedDDPExchange
from course_lib.parallel.exchanges.ddp import DDPExchange
from course_lib.parallel.exchanges.gossip import GossipExchange, SparseGossipExchange
from course_lib.parallel.exchanges.local_sgd import LocalSGD
from course_lib.parallel.exchanges.parameter_server import ParameterServer, ParameterServerSource000
from course_lib.parallel.sharded import SHARDED_EXCHANGES

__all__ = ["EXCHANGES", "make_exchange", "register_exchange"]

EXCHANGES: dict[str, type[GradientExchange]] = {}


def register_exchange(cls: type[GradientExchange]) -> type[GradientExchange]:
    """Add ``cls`` to :data:`EXCHANGES` under ``cls.name``; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, GradientExchange)):
        raise TypeError(f"an exchange method must subclass GradientExchange, got {cls!r}")
    if cls.name in ("", "abstract"):
        raise ValueError(f"{cls.__name__} needs a class attribute name = '...'")
    EXCHANGES[cls.name] = cls
    return cls


for _cls in (
    ParameterServer,
    ParameterServerSource000,
    NaiveAllreduce,
    RingAllreduce,
    BuiltinAllreduce,
    BucketedAllreduce,
    DDPExchange,
    LocalSGD,
    GossipExchange,
    SparseGossipExchange,
    CompressedExchange,
    CompressedDDPExchange,
    *SHARDED_EXCHANGES,
):
    register_exchange(_cls)


def make_exchange(method: str | GradientExchange, **options: Any) -> GradientExchange:
    """Return a new exchange for ``method`` (a name in :data:`EXCHANGES`, or an instance as is)."""
    if isinstance(method, GradientExchange):
        if options:
            raise ValueError("pass options to the exchange's constructor, not with an instance")
        return method
    try:
        cls = EXCHANGES[method]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown exchange method {method!r}; choose one of {', '.join(EXCHANGES)}"
        ) from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"method {method!r} does not take these options {options}: {exc}") from exc
