"""Trace-driven simulation: the real scheduling scripts on a virtual clock (``gpuq simulate``)."""
