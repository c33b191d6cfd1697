"""The instructor's lab: one cluster across the room's PCs (hosts file, SSH, MPI across PCs, roster)."""

__all__: list[str] = []
