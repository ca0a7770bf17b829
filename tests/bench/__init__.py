"""Tests of the benchmark runner (nothing here runs a benchmark)."""
