"""Benchmark harness: runs farpool and its peers in one run and writes results, tables, plots."""
