"""Ready worker apps: ``workers.sim`` (simulated GPUs for demos, tests and benchmarks)."""
