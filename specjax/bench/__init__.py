"""Benchmarking, above decode: costs.py (timed pieces of an iteration), provenance.py
(commit, date, machine, package versions), tables.py (aligned text tables). The harness,
calibration and experiments/ use these."""
