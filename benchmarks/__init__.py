"""Benchmarks: ``python -m benchmarks.run`` (see ``benchmarks/run.py``)."""
