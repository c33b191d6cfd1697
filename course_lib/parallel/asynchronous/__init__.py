"""Lecture 5, asynchronous and stale-synchronous training on a parameter server.

``train`` (the notebook side), ``engine`` (the server and workers on the engines), ``result``
(what a run returns), ``staleness`` (bounds and their checks).
"""

__all__: list[str] = []
