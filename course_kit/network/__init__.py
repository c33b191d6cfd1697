"""The instructor's guide (lecture 3 measures the same links): the network doctor between the lab's PCs and its probe."""

__all__: list[str] = []
