"""The verdict out of the answer's reach: probes that return data, judged in the grader's process.

``core`` turns check cells into probe cells and judges what they print; ``a1`` ... ``a6`` say
how each converted assignment's exercises are probed.
"""

__all__: list[str] = []
