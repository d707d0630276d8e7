"""The lab's benchmarks and probes: each figure the docs quote is measured by one of these.
Run from the repository root as a module, e.g. `python -m benchmarks.bench_plan` (`make bench`
runs every bench_*); each writes its JSON through benchmarks/results.py."""
