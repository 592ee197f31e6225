"""Following a Sentinel failover that the old master has not been told of yet.

A client made for a ``redis+sentinel://`` URL asks the Sentinels for the master only when it
opens a connection. After a planned failover (``SENTINEL FAILOVER``) the old master stays up,
still a master, until the Sentinels reconfigure it (about 10 s was seen), and connections
open to it keep writing there: writes the new master never gets, discarded when the old one
becomes its replica. A hung master (SIGSTOP, a partition) that the Sentinels replace leaves
them waiting for a reply. So the long-lived processes ask the Sentinels again each heartbeat
period (a worker, from its main thread: Sentinels that do not answer must not delay a beat)
or round (the reaper) and, where the master moved, close every connection of the client, in
use or not: each reconnects to the new master on its next command (a command cut off is
retried as after any lost connection). Sentinels that do not answer change nothing. A hung
master's connections are ended by these processes' read timeout (gpuq.cli.base.open_queue).
"""

from __future__ import annotations

import logging

import redis
import redis.sentinel

log = logging.getLogger(__name__)


def follow_master(client: redis.Redis) -> bool:
    """Whether the Sentinels name another master than the one ``client``'s connections go
    to; if so, those connections are closed. A client of another kind, or that has not
    connected yet, asks nothing."""
    pool = client.connection_pool
    if not isinstance(pool, redis.sentinel.SentinelConnectionPool) or not pool.is_master:
        return False
    known = pool.master_address
    if known is None:  # the first connection will ask
        return False
    try:
        found = pool.get_master_address()  # type: ignore[no-untyped-call]  # closes the idle ones if moved
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # the master may be fine
        log.debug("redis.sentinels_unanswered error=%s", exc)
        return False
    if found == known:
        return False
    pool.disconnect(inuse_connections=True)  # a worker keeps one out of the pool (gpuq.wire)
    log.warning("redis.master_moved from=%s:%s to=%s:%s: reconnecting", *known, *found)
    return True
