"""Replica acknowledgement (``replica_acks``: WAIT after each write) and a Sentinel failover.

On a lone master, WAIT finds no replica: an enqueue raises ReplicaTimeout yet stands on the
master, and a worker's ack is logged, not raised. Under Sentinel (a master, one replica,
three sentinels), the master is killed with ``kill -9`` during a soak: with WAIT no
acknowledged enqueue is lost; without it, the loss is measured and printed (it depends on
timing, so it is not asserted).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from conftest import MakeQueue
from helpers import claim
from procs import SIM_APP, Proc, wait_for
from sentinel import SYNC_NOW, SentinelSet, soak, wait_until

from gpuq import Config, Queue
from gpuq.aio import AsyncQueue
from gpuq.client import Task
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError, ConnectionFailed, DuplicateTask
from gpuq.scripts import ClaimRequest, ReplicaTimeout


def test_replica_wait_needs_a_timeout() -> None:
    with pytest.raises(ConfigError, match="replica_wait_ms"):
        Config(replica_acks=1, replica_wait_ms=0).validate()
    assert Config.from_env({"GPUQ_REPLICA_ACKS": "1", "GPUQ_REPLICA_WAIT_MS": "250"}).replica_acks == 1


def test_an_enqueue_no_replica_took_raises_but_stands_on_the_master(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(replica_acks=1, replica_wait_ms=50)
    with pytest.raises(ReplicaTimeout, match="written on the master, but only 0 of 1 replicas") as err:
        q.enqueue("h", model="A", vram_gb=1, task_id="one")
    assert "may be lost in a failover" in str(err.value)
    assert q.record("one").handler == "h"
    with pytest.raises(ReplicaTimeout, match="a call of 3 tasks"):
        q.enqueue_many([{"handler": "h", "model": "A", "vram_gb": 1} for _ in range(3)])
    assert q.redis.zcard(q.keys.queue(2, "A")) == 4
    with pytest.raises(DuplicateTask):  # a rejected enqueue wrote nothing: its own error
        q.enqueue("h", model="A", vram_gb=1, task_id="one")


def test_without_replica_acks_no_wait_is_sent(make_real_queue: MakeQueue) -> None:
    q = make_real_queue()
    q.enqueue("h", model="A", vram_gb=1)
    assert q.calls.enqueue([]).replicas is None


def test_a_workers_ack_no_replica_took_is_logged_not_raised(make_real_queue: MakeQueue,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    plain = make_real_queue()
    waiting = make_real_queue(replica_acks=1, replica_wait_ms=50)
    t = plain.enqueue("h", model="A", vram_gb=1)
    claimed = claim(plain, "w1", 40)
    assert claimed is not None
    caplog.set_level(logging.WARNING, logger="gpuq.scripts")
    ack = waiting.calls.ack(t.id, int(claimed["token"]), '"ok"')
    nxt = waiting.calls.claim(ClaimRequest("w1", 40, 0, 1))
    done, reply = waiting.scripts.pipelined([ack, nxt])  # as Worker.claim sends them
    ack.parse(done)
    assert nxt.parse(reply).task is None
    assert plain.record(t.id).state.value == "succeeded"
    assert [r.getMessage() for r in caplog.records if "write.unreplicated" in r.getMessage()] == [
        f"write.unreplicated what='ack of task {t.id}' acked=0 wanted=1 timeout_ms=50"]


def test_the_async_client_waits_too(redis_server: EmbeddedServer, pool: str, prefix: str) -> None:
    async def scenario() -> None:
        config = Config(prefix=prefix, replica_acks=1, replica_wait_ms=50)
        q = AsyncQueue.from_url(redis_server.url, pool=pool, config=config)
        try:
            with pytest.raises(ReplicaTimeout):
                await q.enqueue("h", model="A", vram_gb=1, task_id="a1")
            with pytest.raises(ReplicaTimeout, match="a call of 2 tasks"):
                await q.enqueue_many([{"handler": "h", "model": "A", "vram_gb": 1}] * 2)
            assert (await q.record("a1")).handler == "h"
        finally:
            await q.close()

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("replica_acks", [1, 0])
def test_a_master_killed_while_its_replica_lags(replica_acks: int, pool: str, prefix: str) -> None:
    """The replica is stopped (SIGSTOP: a stall, a partition) while 24 MB of tasks are
    enqueued, more than the sockets between them hold; the master is killed and the replica
    promoted. Without WAIT the enqueues acknowledged during the stall are gone; with it,
    none was acknowledged (each raised ReplicaTimeout), so none acknowledged is lost."""
    config = Config(pool=pool, prefix=prefix, replica_acks=replica_acks, replica_wait_ms=50)
    master = EmbeddedServer("redis", extra=SYNC_NOW).start()
    replica = EmbeddedServer("redis", extra=[*SYNC_NOW, "--replicaof", "127.0.0.1",
                                             str(master.port)]).start()
    promoted = redis.Redis(port=replica.port, decode_responses=True)
    q = Queue(redis.Redis(port=master.port, decode_responses=True), config)
    try:
        wait_until(lambda: promoted.info("replication")["master_link_status"] == "up", 10, "sync")
        # before the stall: replicated (a loaded host may take more than 50 ms to confirm it)
        steady = Queue(q.redis, replace(config, replica_wait_ms=5000))
        acked = [steady.enqueue("h", model="A", vram_gb=1).id for _ in range(3)]
        assert replica.proc is not None and master.proc is not None
        replica.proc.send_signal(signal.SIGSTOP)
        refused = 0
        for _ in range(30):
            try:
                acked.append(q.enqueue("h", "x" * 800_000, model="A", vram_gb=1).id)
            except ReplicaTimeout:
                refused += 1
        master.proc.kill()
        master.proc.wait(5)
        replica.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: promoted.info("replication")["master_link_status"] == "down", 10,
                   "the replica to see its master gone")
        promoted.execute_command("REPLICAOF", "NO", "ONE")
        lost = [tid for tid in acked if not promoted.exists(q.keys.task(tid))]
    finally:
        if replica.proc is not None and replica.proc.poll() is None:
            replica.proc.send_signal(signal.SIGCONT)
        q.close()
        promoted.close()
        master.stop()
        replica.stop()
    print(f"\nlagging replica replica_acks={replica_acks}: acked={len(acked)} lost={len(lost)} "
          f"refused={refused}")
    if replica_acks:
        assert (len(acked), refused, lost) == (3, 30, [])
    else:
        assert len(acked) == 33 and lost, "every enqueue acknowledged and some lost"


@pytest.mark.slow
@pytest.mark.parametrize("replica_acks", [1, 0])
def test_a_sentinel_failover_mid_soak(replica_acks: int, pool: str, prefix: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 the master while two producers enqueue and a worker runs tasks; the sentinels
    promote the replica and everyone reconnects through them. With WAIT, every acknowledged
    enqueue is on the new master."""
    monkeypatch.setenv("GPUQ_SIM_TIME_SCALE", "0.01")
    config = Config(pool=pool, prefix=prefix, lease_s=10, heartbeat_s=1, idle_block_s=1,
                    replica_acks=replica_acks, replica_wait_ms=1000).validate()
    with SentinelSet() as sentinels:
        old = sentinels.master_address()
        result = soak(sentinels.client, config, sentinels.kill_master, sentinels.restart_old_master)
        assert sentinels.master_address() != old
    print(f"\nsentinel failover replica_acks={replica_acks}: {result.line()}")
    assert result.enqueued > 100 and result.recovery_s < 20
    if replica_acks:
        assert result.lost == 0, result.line()


def sentinel_worker(sentinels: SentinelSet, name: str, pool: str, prefix: str, tmp_path: Path) -> Proc:
    """``gpuq --redis redis+sentinel://... worker``, its heartbeat and idle wait 1 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update({"GPUQ_PREFIX": prefix, "GPUQ_SIM_TIME_SCALE": "0.01", "GPUQ_LEASE_S": "10",
                "GPUQ_HEARTBEAT_S": "1", "GPUQ_IDLE_BLOCK_S": "1", "PYTHONUNBUFFERED": "1"})
    args = [sys.executable, "-m", "gpuq", "--redis", sentinels.url, "--pool", pool, "worker",
            "--app", SIM_APP, "--vram-gb", "80", "--gpu-name", "sim-80GB", "--name", name]
    return Proc(name, args, env, tmp_path / f"{name}.log")


def enqueue_after_failover(q: Queue) -> Task:
    """A task enqueued once the Sentinels name the new master (ConnectionFailed until then)."""
    def enqueued() -> Task | None:
        try:
            return q.enqueue("sim.noop", {"n": 2}, model="m", vram_gb=1)
        except ConnectionFailed:
            return None

    return wait_for(enqueued, 20, interval=0.1, message="an enqueue after the failover")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gpuq.connection") is None,
                    reason="redis+sentinel:// URLs need gpuq.connection, which this tree lacks")
def test_a_worker_process_through_a_sentinel_url_survives_a_failover(pool: str, prefix: str,
                                                                   tmp_path: Path) -> None:
    """``gpuq --redis redis+sentinel://...`` worker: it runs a task before the master is
    killed and one enqueued once the sentinels have promoted the replica."""
    with SentinelSet() as sentinels:
        proc = sentinel_worker(sentinels, "w-url", pool, prefix, tmp_path)
        q = Queue(sentinels.client(), Config(pool=pool, prefix=prefix))
        try:
            wait_for(lambda: q.redis.zscore(q.keys.workers, "w-url") is not None, 20,
                     message=lambda: f"the worker to register; log:\n{proc.log()[-3000:]}")
            assert q.enqueue("sim.noop", {"n": 1}, model="m", vram_gb=1).result(timeout=10) == {"n": 1}
            sentinels.kill_master()
            assert enqueue_after_failover(q).result(timeout=30) == {"n": 2}, proc.log()[-3000:]
        finally:
            q.close()
            proc.stop()


@pytest.mark.slow
def test_a_planned_failover_is_followed_before_the_old_master_is_told() -> None:
    """Found by an operator's drill: after ``SENTINEL FAILOVER`` the old master stays a master
    until the Sentinels reconfigure it (about 10 s), and connections open to it, a worker's
    kept one among them, kept writing there: acknowledged enqueues the new master never got.
    ``follow_master`` (each heartbeat and reaper round) closes them once the Sentinels name
    the new master."""
    from gpuq.connection import connect
    from gpuq.failover import follow_master
    from gpuq.wire import exchange

    with SentinelSet() as sentinels:
        client = connect(sentinels.url)
        try:
            old = sentinels.master_address()
            assert exchange(client, [("INFO", "server")])[0].count(f"tcp_port:{old[1]}") == 1  # kept
            assert client.info("server")["tcp_port"] == old[1]  # from the pool
            assert follow_master(client) is False  # nothing moved
            with redis.Redis(*sentinels.addresses[0], decode_responses=True) as s:
                s.execute_command("SENTINEL", "FAILOVER", "gpuq-test")
            wait_until(lambda: sentinels.master_address() != old, 20, "the sentinels to name the new master")
            new = sentinels.master_address()
            # the Sentinel the client asks may pass the news on a moment later
            wait_until(lambda: follow_master(client), 10, "the client's Sentinel to name the new master")
            assert client.info("server")["tcp_port"] == new[1]
            assert exchange(client, [("INFO", "server")], retry=True)[0].count(f"tcp_port:{new[1]}") == 1
        finally:
            client.close()


@pytest.mark.slow
def test_a_worker_leaves_a_hung_master_the_sentinels_replaced(pool: str, prefix: str,
                                                              tmp_path: Path) -> None:
    """Found by an operator's drill: with the master stopped (SIGSTOP: the kernel still
    answers TCP, so keepalive sees nothing) and the replica promoted, a worker waited on it
    for ever, without a log line: no read timeout. Its reads now end READ_TIMEOUT_S past its
    longest pop, and it reconnects through the Sentinels."""
    with SentinelSet() as sentinels:
        proc = sentinel_worker(sentinels, "w-hung", pool, prefix, tmp_path)
        master = sentinels.master.proc
        assert master is not None
        try:
            with Queue(sentinels.client(), Config(pool=pool, prefix=prefix)) as q:
                wait_for(lambda: q.redis.zscore(q.keys.workers, "w-hung") is not None, 20,
                         message=lambda: f"the worker to register; log:\n{proc.log()[-3000:]}")
                assert q.enqueue("sim.noop", {"n": 1}, model="m", vram_gb=1).result(timeout=10) == {"n": 1}
            old = sentinels.master_address()
            master.send_signal(signal.SIGSTOP)
            wait_until(lambda: sentinels.master_address() != old, 30, "the sentinels to promote the replica")
            with Queue(sentinels.client(), Config(pool=pool, prefix=prefix)) as q:  # the new master
                assert enqueue_after_failover(q).result(timeout=30) == {"n": 2}, proc.log()[-3000:]
        finally:
            master.send_signal(signal.SIGCONT)
            proc.stop()
