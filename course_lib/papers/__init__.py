"""Lecture 8, the sources' experiments reproduced: source 000's table and source 001's ten configurations."""

__all__: list[str] = []
