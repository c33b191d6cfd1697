"""The check cells' functions: one module per lecture or assignment, each printing a verdict.

Checks sit on top of every other layer (they run the reference and the student's code on real
engines); nothing else in the library imports them, and graded answers may not either.
"""

__all__: list[str] = []
