"""gpuq on a Redis Cluster of three masters with a replica each (tests/cluster3.py).

Two pools whose slots lie on different masters run end to end, each with its own worker
process connected through a ``redis+cluster://`` URL; a client pinned to its pool's master
follows a manual failover (MOVED, UNBLOCKED) without an error; and a ``kill -9`` of a pool's
master during a soak is measured as under Sentinel (tests/sentinel.py ``soak``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cluster3 import Cluster3
from helpers import claim
from procs import SIM_APP, Proc, wait_for
from sentinel import soak, wait_until

from gpuq import Config, Queue
from gpuq.cluster import SlotMoved, moved_why, pool_slot
from gpuq.wire import kept_connection

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster3]:
    with Cluster3() as c:
        yield c


def worker_proc(url: str, pool: str, prefix: str, name: str, tmp_path: Path) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update({"GPUQ_PREFIX": prefix, "GPUQ_SIM_TIME_SCALE": "0.01", "GPUQ_LEASE_S": "10",
                "GPUQ_HEARTBEAT_S": "1", "GPUQ_IDLE_BLOCK_S": "1", "PYTHONUNBUFFERED": "1"})
    args = [sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "worker", "--app", SIM_APP,
            "--vram-gb", "80", "--gpu-name", "sim-80GB", "--name", name]
    return Proc(name, args, env, tmp_path / f"{name}.log")


def wait_registered(q: Queue, proc: Proc) -> None:
    wait_for(lambda: q.redis.zscore(q.keys.workers, proc.name) is not None, 20,
             message=lambda: f"{proc.name} to register; log:\n{proc.log()[-3000:]}")


def test_two_pools_on_different_masters_each_run_by_its_worker(cluster: Cluster3, prefix: str,
                                                               tmp_path: Path) -> None:
    first, second = cluster.masters()[:2]
    pools = [cluster.pool_on(first, "a"), cluster.pool_on(second, "b")]
    assert [cluster.owner(p) for p in pools] == [first, second]
    procs = [worker_proc(cluster.url, p, prefix, f"w-{p}", tmp_path) for p in pools]
    queues = [Queue(cluster.client(p), Config(pool=p, prefix=prefix)) for p in pools]
    try:
        for q, proc in zip(queues, procs):
            wait_registered(q, proc)
        tasks = [[q.enqueue("sim.noop", {"pool": q.config.pool, "i": i}, model="m", vram_gb=1)
                  for i in range(5)] for q in queues]
        for q, batch in zip(queues, tasks):
            assert [t.result(timeout=15) for t in batch] == [{"pool": q.config.pool, "i": i}
                                                             for i in range(5)]
            assert {q.record(t.id).worker for t in batch} == {f"w-{q.config.pool}"}
        # each pool's keys are on its own master, none on the other
        for q, mine, other in zip(queues, (first, second), (second, first)):
            with cluster.node_client(mine) as node:
                assert node.exists(q.keys.task(tasks[queues.index(q)][0].id)) == 1
            with cluster.node_client(other) as node, pytest.raises(redis.exceptions.MovedError):
                node.exists(q.keys.task(tasks[queues.index(q)][0].id))
    finally:
        for q in queues:
            q.close()
        for proc in procs:
            proc.stop()


def test_a_key_outside_the_pools_slot_is_an_error_not_a_move(cluster: Cluster3) -> None:
    masters = cluster.masters()
    mine, theirs = cluster.pool_on(masters[0], "k"), cluster.pool_on(masters[1], "k")
    client = cluster.client(mine)
    try:
        with pytest.raises(redis.exceptions.MovedError):
            client.get(f"gpuq:{{{theirs}}}:x")
        assert pool_slot(theirs) != pool_slot(mine) and client.ping()
    finally:
        client.close()


def test_a_pinned_client_follows_a_manual_failover(cluster: Cluster3, prefix: str) -> None:
    """CLUSTER FAILOVER on the replica: the old master answers MOVED and unblocks the
    result waiter; both go on at the new master, no error reaches the caller."""
    master = cluster.masters()[2]
    pool = cluster.pool_on(master, "f")
    replica = cluster.replicas_of(master)[0]
    q = Queue(cluster.client(pool), Config(pool=pool, prefix=prefix))
    try:
        waited = q.enqueue("h", model="A", vram_gb=1)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(waited.result(timeout=20)))
        waiter.start()
        wait_until(lambda: kept_connection(q.redis) is not None, 5, "the waiter to block")
        with cluster.node_client(replica) as node:
            node.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: cluster.owner(pool) == replica, 15, "the replica to take over")
        second = q.enqueue("h", model="A", vram_gb=1)  # MOVED, then sent again to the new master
        c = claim(q, "w1", 40)
        assert c is not None and c["id"] == waited.id
        q.scripts.run(q.calls.ack(waited.id, int(c["token"]), '{"ok": 1}'))
        waiter.join(20)
        assert got == [{"ok": 1}]
        assert q.record(second.id).state.value == "queued"
        assert q.redis.connection_pool.get_connection().port == replica
    finally:
        q.close()


def test_moved_is_raised_as_slot_moved_without_retries(cluster: Cluster3) -> None:
    master = cluster.masters()[0]
    pool = cluster.pool_on(master, "r")
    client = cluster.client(pool, retry=None)
    other = cluster.masters()[1]
    client.connection_pool.connection_kwargs["slot_map"].hint = ("127.0.0.1", other)
    try:
        moved = f"moved from 127.0.0.1:{other} to 127.0.0.1:{master} \\(MOVED\\)"
        with pytest.raises(SlotMoved, match=moved):
            client.get(f"gpuq:{{{pool}}}:x")
        assert client.get(f"gpuq:{{{pool}}}:x") is None  # the MOVED's address was used
    finally:
        client.close()


@pytest.mark.parametrize("replica_acks", [1, 0])
def test_a_master_failover_mid_soak(replica_acks: int, prefix: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 the master of a pool's slot while two producers enqueue and a worker runs
    tasks; the cluster promotes its replica. With WAIT, every acknowledged enqueue is on
    the new master."""
    monkeypatch.setenv("GPUQ_SIM_TIME_SCALE", "0.01")
    with Cluster3() as c:
        master = c.masters()[0]
        pool = c.pool_on(master, "s")
        replica = c.replicas_of(master)[0]
        config = Config(pool=pool, prefix=prefix, lease_s=10, heartbeat_s=1, idle_block_s=1,
                        replica_acks=replica_acks, replica_wait_ms=1000).validate()
        result = soak(lambda: c.client(pool), config, lambda: c.kill(master),
                      lambda: c.restart_as_replica(master, replica))
        assert c.owner(pool) == replica
    print(f"\ncluster failover replica_acks={replica_acks}: {result.line()}")
    assert result.enqueued > 100 and result.recovery_s < 20
    if replica_acks:
        assert result.lost == 0, result.line()


def test_a_slot_migrating_or_a_cluster_down_is_said_as_such() -> None:
    """Found by an operator's drill: both read "slot 8727 left 127.0.0.1:17022: ..." (the raw
    redirect), under "cannot reach Redis"; a full-coverage cluster's CLUSTERDOWN did not say
    why a healthy shard refused."""
    ask = redis.exceptions.AskError("8727 127.0.0.1:17023")
    assert moved_why(ask, 8727, "127.0.0.1:17022") == (
        "slot 8727 is migrating from 127.0.0.1:17022 to 127.0.0.1:17023 (ASK): the pool's calls "
        "fail until the migration ends (its scripts need all of its keys on one node)")
    down = redis.exceptions.ClusterDownError("The cluster is down")
    assert "cluster-require-full-coverage yes (the default)" in moved_why(down, 1, "h:1")
