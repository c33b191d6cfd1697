"""The check cells' functions of every lecture and assignment: one module per lecture (``lectureNN``), one per assignment under
``assignments/`` (``aN``, with its helpers ``aN_*``), each printing a verdict (``verdict``).

Checks sit on top of every other layer (they run the reference and the student's code on real
engines); nothing else in the library imports them, and graded answers may not either.
"""

__all__: list[str] = []
