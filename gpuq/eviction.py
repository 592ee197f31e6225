"""Whether the Redis server may evict keys, which would lose tasks.

Redis evicts only once `maxmemory` is set and reached; under any `maxmemory-policy` but
`noeviction` it then deletes keys: a queued task's hash, a queue, a lease, the reaper's lock
(the `volatile-*` policies pick among keys with a TTL, which gpuq's leases, locks and ended
tasks carry). No guarantee of gpuq holds then: a task can vanish, or two reapers act at once.
Under `noeviction` a full server refuses writes instead, which gpuq reports (out of memory)
and its workers retry. The reaper logs this at start; `gpuq status` shows it. INFO is in
the roles that read the pool (gpuq.acl), not in the worker's.
"""

from __future__ import annotations

from typing import Any

import redis


def risk(client: Any) -> str | None:
    """One line saying the server may evict keys, or None (also when this user may not run
    INFO: an ACL user of the server's own making)."""
    try:
        info = client.info("memory")
    except redis.ResponseError:  # NOPERM included
        return None
    policy = str(info.get("maxmemory_policy", "noeviction"))
    try:
        limit = int(info.get("maxmemory", 0))
    except (TypeError, ValueError):
        return None
    if policy == "noeviction" or limit <= 0:
        return None
    return (f"Redis may evict keys (maxmemory-policy {policy}, maxmemory {limit} bytes): queued "
            "and running tasks can be lost when it fills; set maxmemory-policy noeviction")
