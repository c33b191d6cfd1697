"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): one cluster across the room's PCs (hosts file, SSH, MPI across PCs, roster)."""

__all__: list[str] = []
