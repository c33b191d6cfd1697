"""The emulated room (root, Linux; docs/instructor.md's rehearsal; lecture 3's links): PCs as network namespaces on a bridge, links shaped with tc.

``build`` (``emulated_room``, the Room), ``namespaces``, ``shaping``, ``teardown``, ``state``
(the room on disk), ``ssh`` (SSH stand-ins to reach a PC), ``cluster`` (a cluster across it).
"""

__all__: list[str] = []
