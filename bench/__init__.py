"""Benchmarks: each prints a table and writes JSON + PNG under bench/results/, stamped."""
