"""Offline tools: evaluation, calibration, benchmarks. Entry points: they switch the network off first."""
from pipeline.offline import enable_offline

enable_offline()
