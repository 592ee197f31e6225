"""The chaos soak behind scripts/chaos.py: cluster, faults, producers, observer, checker, report."""
