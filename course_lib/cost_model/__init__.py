"""Lectures 3-4 (and 13's simulator): what communication should cost, and how well that prediction holds.

``alpha_beta`` (the latency-bandwidth model, fits, ping-pong), ``calibration`` (alpha and beta
fitted on the collective itself), ``prediction`` (a data-parallel step's time from the model).
"""

__all__: list[str] = []
