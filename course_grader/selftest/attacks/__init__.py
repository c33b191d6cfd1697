"""No lecture (the grader). ``./kit grade --self-test``: attacks a determined student would try, each graded end to end.

``sandbox`` reaches for the machine (files, network, processes, the grader's clean-up);
``verdict`` reaches for the verdict from inside the kernel (A1); ``engines`` does so once per
engine assignment (A2-A7, A9).
"""

__all__: list[str] = []
