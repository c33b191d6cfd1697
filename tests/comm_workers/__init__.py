"""Helpers that run communication tests on real processes (mpiexec ranks or gloo subprocesses)."""
