"""No lecture (the grader). The verdict out of the answer's reach: probes that return data (``probe``; ``engine_probe`` for answers run on engines), judged in the grader's process; what the ranks' reports imply on the wire (``claims``) held against the bytes counted there (``wire``); the ``ast`` guard on answer cells (``guard``)."""

__all__: list[str] = []
