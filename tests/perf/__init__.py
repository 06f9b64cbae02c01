"""Benchmarks: scripts that print numbers (``make bench``), not timed unit tests."""
