"""Benchmarks of the residents pipeline: its cost beside the bare SDK, and how each step grows.

Run everything with `.venv/bin/python -m bench`; see bench/README.md for the figures.
"""
