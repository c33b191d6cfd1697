"""No lecture (the grader). The grader testing itself: the instructor's answers through the whole path (``selfcheck``) and the attacks it must hold (``attacks``)."""

__all__: list[str] = []
