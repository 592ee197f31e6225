"""Operator views of a pool: what ``gpuq status``, ``gpuq top``, ``gpuq task`` and the
exporter read from Redis (inspect) and how they show it (render, top, exporter)."""
