"""A host crash under ``appendfsync everysec``, emulated on loopback.

kill -9 of the server alone loses nothing with either setting: the server writes its
append-only file before it replies, so the acknowledged writes are in the kernel's page cache
and survive the process. What ``everysec`` risks is a crash of the host (or a power loss),
which drops the writes not yet fsynced: up to about one second of them (two when the disk is
slow). The soak emulates that crash: it freezes the server, kills it, and cuts its
incremental append-only file back to the size it had one second earlier (sampled every 50
ms), so the server restarts without the last second of acknowledged writes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path

SAMPLE_S = 0.05


def incr_file(data_dir: Path) -> Path | None:
    """The incremental file the server appends to (the manifest's last ``type i`` entry)."""
    manifests = list((data_dir / "appendonlydir").glob("*.manifest"))
    if not manifests:
        return None
    name = None
    for line in manifests[0].read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == "i":
            name = parts[1]
    return data_dir / "appendonlydir" / name if name else None


class AofWatch:
    """Samples the incremental file's size, to know what it held ``seconds`` ago."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.samples: deque[tuple[float, Path, int]] = deque(maxlen=200)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="aof-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            path = incr_file(self.data_dir)
            try:
                size = path.stat().st_size if path else -1
            except OSError:
                continue
            if path is not None:
                self.samples.append((time.monotonic(), path, size))

    def size_ago(self, seconds: float) -> tuple[Path, int] | None:
        """(file, size) from the newest sample at least ``seconds`` old."""
        cutoff = time.monotonic() - seconds
        older = [(p, s) for t, p, s in self.samples if t <= cutoff]
        return older[-1] if older else None

    def cut_back(self, seconds: float) -> int:
        """Truncate the file to its size ``seconds`` ago (the server must be down); the bytes
        cut (0 when the file changed meanwhile or there is no such sample)."""
        then = self.size_ago(seconds)
        now = incr_file(self.data_dir)
        if then is None or now is None or then[0] != now:
            return 0
        size_now = now.stat().st_size
        if then[1] >= size_now:
            return 0
        os.truncate(now, then[1])
        self.samples.clear()  # sizes before the cut no longer describe the file
        return size_now - then[1]

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(1)
