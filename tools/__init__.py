"""Offline tools, by kind: ops/ (admin commands against a running app or a data dir), eval/ (evaluation and
calibration on the dev sets, rerun when the pipeline changes), bench/ (benchmarks), docs/ (generated docs).
Entry points: they switch the network off first. Nothing outside tools/ (and tests/) imports them."""
from pipeline.models.offline import enable_offline

enable_offline()
