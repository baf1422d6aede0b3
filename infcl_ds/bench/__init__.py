"""Benchmark scripts (`infcl-ds bench ...`): never timed tests; rows go to docs/benchmarks."""
