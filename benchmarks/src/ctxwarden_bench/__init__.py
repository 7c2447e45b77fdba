"""Benchmarks and experiments (R17): each module runs with ``python -m ctxwarden_bench.<name>``."""
