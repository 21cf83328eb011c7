"""Benchmarks (speed and load): numbers for docs/benchmarks.md. They may use tools.eval (dev sets, KB cache) and
tools.ops (the app's HTTP client); nothing imports them."""
