"""The gpusv benchmark: `python -m bench.run` (see docs/performance.md)."""
