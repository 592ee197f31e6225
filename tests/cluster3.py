"""A Redis Cluster of three masters, one replica each, on loopback (tests only).

``Cluster3`` starts six ``redis-server --cluster-enabled yes`` nodes on free ports (each its
own directory, kept across a restart so the node rejoins with its nodes.conf), joins them
with ``redis-cli --cluster create ... --cluster-replicas 1``, waits until every node sees
the cluster ok, and stops them all at exit. ``pool_on`` picks a pool name whose hash slot a
given master owns; ``kill``/``restart`` make a failover.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import redis
from sentinel import SYNC_NOW, wait_until

from gpuq.cluster import cluster_client, pool_slot
from gpuq.embedded import EmbeddedServer, free_port

NODE_TIMEOUT_MS = 1000  # a master silent this long is failed over to its replica


class Cluster3:
    def __init__(self) -> None:
        self.nodes: list[EmbeddedServer] = []

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.addresses[:3])

    def start(self) -> Cluster3:
        try:
            for _ in range(6):
                node = EmbeddedServer("redis")
                node.port = free_port()
                node.extra = [*SYNC_NOW, "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                              "--cluster-config-file", "nodes.conf",
                              "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                              # a pool lives on one master: the others serve on while it fails over
                              "--cluster-require-full-coverage", "no"]
                self.nodes.append(node.start())
            cli = shutil.which("redis-cli")
            assert cli, "redis-cli is needed to create the cluster"
            subprocess.run([cli, "--cluster", "create", *(f"{h}:{p}" for h, p in self.addresses),
                            "--cluster-replicas", "1", "--cluster-yes"], check=True,
                           capture_output=True, timeout=60)
            wait_until(self.ready, 30, "every node to see the cluster ok")
        except BaseException:
            self.stop()
            raise
        return self

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=2)

    def ready(self) -> bool:
        for node in self.nodes:
            with self.node_client(node.port) as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:6" not in text:
                    return False
        shards = self.slot_map()
        if len({m for _, _, m, _ in shards}) != 3 or not all(rs for _, _, _, rs in shards):
            return False
        for master in {m for _, _, m, _ in shards}:  # each replica's link is up (WAIT needs it)
            with self.node_client(master) as c:
                if c.info("replication")["connected_slaves"] < 1:
                    return False
        return True

    def slot_map(self) -> list[tuple[int, int, int, list[int]]]:
        """(first slot, last slot, master port, replica ports) from a live node's CLUSTER
        NODES (CLUSTER SLOTS lists a replica only once it has replicated some writes)."""
        for node in self.alive():
            try:
                with self.node_client(node.port) as c:
                    text = c.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            lines = [line.split() for line in str(text).splitlines() if line.strip()]
            port_of = {f[0]: int(f[1].split("@")[0].rsplit(":", 1)[1]) for f in lines}
            replicas: dict[str, list[int]] = {}
            for f in lines:
                if "slave" in f[2] and "fail" not in f[2]:
                    replicas.setdefault(f[3], []).append(port_of[f[0]])
            out = []
            for f in lines:
                for span in f[8:]:
                    if "master" in f[2] and not span.startswith("["):
                        first, _, last = span.partition("-")
                        out.append((int(first), int(last or first), port_of[f[0]], replicas.get(f[0], [])))
            return sorted(out)
        raise AssertionError("no live node")

    def alive(self) -> Iterator[EmbeddedServer]:
        return (n for n in self.nodes if n.proc is not None and n.proc.poll() is None)

    def masters(self) -> list[int]:
        return sorted({m for _, _, m, _ in self.slot_map()})

    def owner(self, pool: str) -> int:
        slot = pool_slot(pool)
        return next(m for s, e, m, _ in self.slot_map() if s <= slot <= e)

    def replicas_of(self, port: int) -> list[int]:
        return sorted({r for _, _, m, rs in self.slot_map() if m == port for r in rs})

    def pool_on(self, master: int, stem: str = "p") -> str:
        """The first pool name ``<stem><n>`` whose slot ``master`` owns."""
        ranges = [(s, e) for s, e, m, _ in self.slot_map() if m == master]
        for i in range(100_000):
            slot = pool_slot(f"{stem}{i}")
            if any(s <= slot <= e for s, e in ranges):
                return f"{stem}{i}"
        raise AssertionError(f"no pool name found for master {master}")

    def client(self, pool: str, **options: Any) -> redis.Redis:
        kwargs: dict[str, Any] = {"decode_responses": True, "socket_timeout": None,
                                  "socket_connect_timeout": 1}
        kwargs.update(options)
        return cluster_client(self.addresses, pool, **kwargs)

    def node(self, port: int) -> EmbeddedServer:
        return next(n for n in self.nodes if n.port == port)

    def kill(self, port: int) -> None:
        proc = self.node(port).proc
        assert proc is not None
        proc.kill()  # SIGKILL
        proc.wait(5)

    def restart_as_replica(self, port: int, replica: int) -> None:
        """Once ``replica`` has taken over the killed ``port``'s slots, start ``port`` again:
        with its nodes.conf it rejoins as a replica of the new master."""
        wait_until(lambda: replica in self.masters(), 30, f"node {replica} to be promoted")
        node = self.node(port)
        node.stop(keep_dir=True)
        node.start()  # it syncs in the background; WAIT succeeds once it has

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes.clear()

    def __enter__(self) -> Cluster3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
