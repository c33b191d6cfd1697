"""No lecture (the grader). The sandbox a submission runs in: its settings, the child that enters it, the guard on the kit's files, nbval's channel out, the count of bytes on the wire."""

__all__: list[str] = []
