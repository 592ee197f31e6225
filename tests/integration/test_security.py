"""Credentials, TLS, Sentinel and ACL roles against real redis-server processes this module
starts (a password, ACL users, TLS with client certificates, a Sentinel), with real worker,
reaper and CLI processes.

Each fault must end as one "Error: ..." line and exit 1, never a traceback, and no password
may reach any output or log line.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from procs import Procs, est, wait_for

from gpuq import State
from gpuq.acl import setuser
from gpuq.aio import AsyncQueue
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.embedded import EmbeddedServer, free_port, stop_process
from gpuq.errors import TlsFailed
from gpuq.functions import library
from gpuq.keys import Keys
from gpuq.scripts import SCRIPT_NAMES
from gpuq.task import ended_count

pytestmark = pytest.mark.slow

SECRET = "s3cret-Zq9"  # what must never be printed
REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="needs redis-server on PATH")


class Server:
    """A redis-server (a Sentinel with a ``conf`` file) in its own directory; ``args`` come
    last, so they override the defaults (``--port 0``: no plain port)."""

    def __init__(self, workdir: Path, *args: str, conf: Path | None = None) -> None:
        assert REDIS_SERVER is not None
        self.port = free_port()
        self.dir = workdir / f"server-{self.port}"
        self.dir.mkdir()
        self.log = self.dir / "server.log"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, *([str(conf)] if conf else []), "--port", str(self.port), "--bind",
             "127.0.0.1", "--dir", str(self.dir), "--save", "", "--logfile", str(self.log), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def wait(self, client: redis.Redis) -> redis.Redis:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited: {self.log.read_text(errors='replace')}")
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 10, 0.02, "redis-server to answer")
        return client

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*args: str, conf: Path | None = None) -> Server:
        started.append(Server(tmp_path, *args, conf=conf))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def one_line_error(out: subprocess.CompletedProcess[str], *fragments: str, code: int = 5) -> str:
    """Exit ``code`` (5: Redis could not be used; 2: a configuration refused; 1: other), one
    "Error: ..." line on stderr, nothing on stdout, no traceback, no secret."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("Error: "), line
    for fragment in fragments:
        assert fragment in line, line
    assert SECRET not in out.stdout + out.stderr
    return line


def procs_for(url: str, pool: str, prefix: str, workdir: Path, admin: redis.Redis, **env: str) -> Procs:
    """Procs whose processes use ``url``; its own waits read the pool as ``admin``."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs("redis://unused", pool, prefix, workdir, **env)  # its client would not parse url
    procs.redis.close()
    procs.redis, procs.url = admin, url
    return procs


@needs_redis
def test_a_wrong_password_is_one_line_that_never_shows_it(servers: Callable[..., Server],
                                                          tmp_path: Path) -> None:
    """The defect: the CLI printed the URL with its password and called a refused login
    "cannot reach". Every command, logs at DEBUG in both formats."""
    server = servers("--requirepass", "another-password")
    server.wait(redis.Redis(port=server.port, password="another-password"))
    url = f"redis://:{SECRET}@127.0.0.1:{server.port}/0"
    shown = f"redis://:***@127.0.0.1:{server.port}/0"
    procs = Procs(url, "p", "gpuq", tmp_path)
    try:
        for args in (["status"], ["enqueue", "sim.run", "--model", "m", "--vram-gb", "1"],
                     ["--log-level", "DEBUG", "worker", "--app", "workers.sim:app", "--vram-gb", "8"],
                     ["--log-level", "DEBUG", "--log-format", "json", "reaper"]):
            line = one_line_error(procs.cli(*args), f"authentication failed for Redis at {shown}: ")
            assert "cannot reach" not in line
        user = f"redis://gpuq:{SECRET}@127.0.0.1:{server.port}/0"
        one_line_error(cli_at(procs, user, "status"), f"authentication failed for Redis at redis://gpuq:***@127.0.0.1:{server.port}/0")
    finally:
        procs.close()


@needs_redis
def test_a_cluster_that_refuses_the_login_says_so(servers: Callable[..., Server],
                                                  tmp_path: Path) -> None:
    """The defect: a redis+cluster:// URL with a wrong or missing password printed "cannot
    reach Redis" (the slot-map lookup folded the refusal into a connection error)."""
    server = servers("--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf"),
                     "--cluster-port", str(free_port()),  # not port + 10000, which may pass 65535
                     "--requirepass", "another-password")
    admin = server.wait(redis.Redis(port=server.port, password="another-password"))
    admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    procs = Procs(f"redis://127.0.0.1:{server.port}/0", "p", "gpuq", tmp_path)
    try:
        for auth, shown in ((f":{SECRET}@", ":***@"), ("", "")):
            url = f"redis+cluster://{auth}127.0.0.1:{server.port}"
            line = one_line_error(cli_at(procs, url, "status"),
                                  f"authentication failed for Redis at redis+cluster://{shown}127.0.0.1")
            assert "cannot reach" not in line
    finally:
        procs.close()


def make_certs(tmp_path: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path / "tls"
    d.mkdir()

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gpuq test CA")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=gpuq {name}")
        (d / f"{name}.ext").write_text(ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {n: str(d / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@needs_redis
def test_tls_with_client_certificates_end_to_end(servers: Callable[..., Server], tmp_path: Path,
                                                 prefix: str) -> None:
    certs = make_certs(tmp_path)
    port = free_port()
    server = servers("--port", "0", "--tls-port", str(port), "--tls-cert-file", certs["server.crt"],
                     "--tls-key-file", certs["server.key"], "--tls-ca-cert-file", certs["ca.crt"],
                     "--tls-auth-clients", "yes")
    tls_url = f"rediss://127.0.0.1:{port}/0"
    admin = redis.Redis.from_url(tls_url, ssl_ca_certs=certs["ca.crt"], ssl_certfile=certs["client.crt"],
                                 ssl_keyfile=certs["client.key"], decode_responses=True)
    try:
        server.wait(admin)
    except AssertionError as exc:
        if "tls" in str(exc).lower():  # a server built without TLS rejects the options
            pytest.skip(f"this redis-server has no TLS: {exc}")
        raise
    pool = f"tls{uuid.uuid4().hex[:8]}"
    env = {"GPUQ_TLS_CA": certs["ca.crt"], "GPUQ_TLS_CERT": certs["client.crt"],
           "GPUQ_TLS_KEY": certs["client.key"]}
    with procs_for(tls_url, pool, prefix, tmp_path / "procs", admin) as procs:
        procs.worker("w-tls", env=env)  # TLS files from the environment
        options = ["--tls-ca", certs["ca.crt"], "--tls-cert", certs["client.crt"], "--tls-key",
                   certs["client.key"]]  # the producer's from the CLI options
        out = procs.cli(*options, "enqueue", "sim.noop", "--payload", '{"echo": "tls"}', "--model", "m",
                        "--vram-gb", "4", "--wait", "--timeout", "20")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"echo": "tls"}
        no_ca = one_line_error(procs.cli("status"), f"TLS handshake with Redis at {tls_url} failed: ",
                               "certificate verify failed")
        assert "self-signed" in no_ca or "local issuer" in no_ca or "unable to get" in no_ca, no_ca
        no_client_cert = procs.cli("status", env={"GPUQ_TLS_CA": certs["ca.crt"]})
        one_line_error(no_client_cert, f"TLS handshake with Redis at {tls_url} failed: ")
        with pytest.raises(TlsFailed, match="client certificate"):  # asyncio saw only a reset
            asyncio.run(async_enqueue(tls_url, Config(tls_ca=certs["ca.crt"])))
        plain = f"redis://127.0.0.1:{port}/0"
        one_line_error(cli_at(procs, plain, "status"), f"cannot reach Redis at {plain}")
        one_line_error(cli_at(procs, plain, "status", env=env), "is not TLS: use rediss://", code=2)


async def async_enqueue(url: str, config: Config) -> None:
    async with AsyncQueue.from_url(url, pool="p", config=config) as q:
        await q.enqueue("sim.noop", {}, model="m", vram_gb=1)


def cli_at(procs: Procs, url: str, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    """A CLI command against another URL than the Procs' own."""
    return subprocess.run([*procs.base_args()[:3], "--redis", url, "--pool", procs.pool, *args],
                          env=procs.environment(env), capture_output=True, text=True, timeout=30)


def admin_server(servers: Callable[..., Server]) -> tuple[Server, redis.Redis]:
    server = servers("--requirepass", "admin-pw")
    client = redis.Redis(port=server.port, password="admin-pw", decode_responses=True)
    return server, server.wait(client)


def role_url(port: int, role: str) -> str:
    return f"redis://gpuq-{role}:{SECRET}-{role}@127.0.0.1:{port}/0"


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


ROLES = ("producer", "worker", "reaper", "observer")


@needs_redis
def test_each_role_runs_under_its_own_least_privilege_user(servers: Callable[..., Server],
                                                           tmp_path: Path, prefix: str) -> None:
    """Worker, reaper and producer each log in as their own ACL user (gpuq acl's rules): a
    task runs end to end, a preemption and a SIGKILL recovery go through, and the server's
    ACL log shows no command or key refused. Each user is refused other pools' keys and
    admin commands, and the CLI says so in one line. The administrator has loaded the
    scripts' library first, as docs/RELIABILITY.md says (no role may)."""
    server, admin = admin_server(servers)
    pool = f"acl{uuid.uuid4().hex[:8]}"
    for role in ROLES:
        line = setuser(role, pool, f"gpuq-{role}", f"{SECRET}-{role}", prefix)
        admin.execute_command(*line.split())
    admin.function_load(library(SCRIPT_NAMES).source)
    url = {role: role_url(server.port, role) for role in ROLES}
    preempt_env = {"GPUQ_MAX_WAIT_S": "1", "GPUQ_GRACE_S": "1.5", "GPUQ_PREEMPT_MIN_RUNTIME_S": "0.2"}
    procs = {role: procs_for(url[role], pool, prefix, tmp_path / role, admin,
                             **(preempt_env if role == "reaper" else {})) for role in ROLES}
    workers, producer = procs["worker"], procs["producer"]
    queue = Queue.from_url(url["producer"], pool=pool, config=Config(prefix=prefix))
    metrics_port = free_port()
    outputs: list[str] = []
    try:
        w1 = workers.start("w1", ["--log-level", "DEBUG", "worker", "--app", "workers.sim:app",
                                  "--vram-gb", "48", "--name", "w1", "--metrics-port", str(metrics_port)])
        workers.wait_registered(w1)
        assert listening_addresses(metrics_port) == {"0100007F"}  # 127.0.0.1 only
        reaper = procs["reaper"].start("reaper", ["--log-level", "DEBUG", "reaper"])
        wait_for(lambda: "reaper.active" in reaper.log(), 15, message="the reaper to lead")
        # end to end through the CLI: enqueue, run, wait for the result
        out = producer.cli("enqueue", "sim.noop", "--payload", '{"echo": 1}', "--model", "m1",
                           "--vram-gb", "8", "--wait", "--timeout", "20")
        outputs += [out.stdout, out.stderr]
        assert out.returncode == 0 and json.loads(out.stdout) == {"echo": 1}, out.stderr
        # preemption: a P0 task arrives while a long P3 task holds the only GPU
        batch = queue.enqueue("sim.run", model="m-batch", vram_gb=30, priority="P3", est_s=est(3))
        workers.wait_state(batch.id, State.RUNNING)
        online = queue.enqueue("sim.run", model="m-online", vram_gb=30, priority="P0", est_s=est(0.2))
        assert online.result(timeout=20)["worker"] == "w1"
        assert int(admin.hget(Keys(pool, prefix).stats, "preempt:yield_requested") or 0) >= 1
        # recovery: the worker dies mid-task; the reaper requeues, a new worker finishes it
        workers.wait_state(batch.id, State.RUNNING)
        w1.kill()
        w2 = workers.worker("w2", vram_gb=48)
        done = workers.wait_state(batch.id, State.SUCCEEDED, timeout=30)
        assert done.worker == "w2" and done.attempt >= 2
        # a restart under a killed worker's name recovers its task itself, as the worker's user
        again = queue.enqueue("sim.run", model="m-batch", vram_gb=30, priority="P3", est_s=est(3))
        workers.wait_state(again.id, State.RUNNING)
        w2.kill()
        w2.wait(10)
        time.sleep(1.0)  # past 1.5 heartbeats: the name's process stopped beating
        workers.worker("w2", vram_gb=48)
        assert workers.wait_state(again.id, State.SUCCEEDED, timeout=30).attempt == 2
        status = procs["observer"].cli("status", "--json")
        outputs += [status.stdout, status.stderr]
        assert status.returncode == 0 and json.loads(status.stdout)["pool"] == pool, status.stderr
        # redis-py's CLIENT SETINFO is refused on Redis >= 7.2 and ignored by the client
        refusals = [e for e in admin.acl_log(count=100) if e["object"] != "client|setinfo"]
        assert refusals == [], refusals
        outputs += assert_refused_outside_their_rules(server.port, pool, prefix, producer)
        logs = "".join(p.logs() for p in procs.values()) + "".join(outputs)
        assert "worker.started worker=w1" in logs and "reaper.recovered" in logs
        assert SECRET not in logs
    finally:
        queue.close()
        for p in procs.values():
            p.close()


def assert_refused_outside_their_rules(port: int, pool: str, prefix: str, producer: Procs) -> list[str]:
    """Every role: its pool's keys are allowed; another pool's keys and admin commands are
    refused. Returns the CLI output it checked."""
    other = Keys(f"other{pool}", prefix)
    for role in ROLES:
        client = redis.Redis.from_url(role_url(port, role), decode_responses=True)
        try:
            client.get(Keys(pool, prefix).task("x"))
            for command in (("GET", other.task("x")), ("FLUSHALL",), ("CONFIG", "GET", "requirepass"),
                            ("KEYS", "*"), ("ACL", "LIST")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    client.execute_command(*command)
        finally:
            client.close()
    out = producer.cli("--pool", other.pool, "enqueue", "sim.noop", "--model", "m", "--vram-gb", "1")
    one_line_error(out, "refused a command to this user: ", code=1)
    return [out.stdout, out.stderr]


@needs_redis
def test_every_command_reaches_the_master_through_a_sentinel(servers: Callable[..., Server],
                                                             tmp_path: Path, prefix: str) -> None:
    master = servers()
    admin = master.wait(redis.Redis(port=master.port, decode_responses=True))
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"sentinel monitor gpuq-master 127.0.0.1 {master.port} 1\n")
    sentinel = servers("--sentinel", conf=conf)
    sentinel.wait(redis.Redis(port=sentinel.port))
    pool = f"sen{uuid.uuid4().hex[:8]}"
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/gpuq-master"
    with procs_for(url, pool, prefix, tmp_path / "procs", admin) as procs:
        procs.worker("w-sentinel")
        out = procs.cli("enqueue", "sim.noop", "--payload", '"via sentinel"', "--model", "m",
                        "--vram-gb", "4", "--wait", "--timeout", "20")
        assert out.returncode == 0 and json.loads(out.stdout) == "via sentinel", out.stderr
        assert ended_count(admin.hgetall(Keys(pool, prefix).stats), "succeeded") == 1  # it ran on the master
        one_line_error(cli_at(procs, url.replace("gpuq-master", "nope"), "status"),
                       "no master from the Sentinels at redis+sentinel://", "No master found for 'nope'")
        nobody = f"redis+sentinel://:{SECRET}@127.0.0.1:{free_port()}/m"
        one_line_error(cli_at(procs, nobody, "status"), "(Sentinels that failed: ConnectionError)")
        # redis:// at the Sentinel's own port: one line naming the command it does not know,
        # with no warning first about the library it refused (gpuq.functions.Sender)
        at_sentinel = f"redis://127.0.0.1:{sentinel.port}/0"
        for args in (("enqueue", "sim.noop", "--model", "m", "--vram-gb", "1"), ("reaper", "--once")):
            one_line_error(cli_at(procs, at_sentinel, *args), "does not know the command", code=2)


def test_the_exporter_listens_on_loopback_by_default(redis_server: EmbeddedServer, tmp_path: Path,
                                                     prefix: str) -> None:
    port = free_port()
    with Procs(redis_server.url, "p", prefix, tmp_path) as procs:
        exporter = procs.start("exporter", ["exporter", "--port", str(port)])
        wait_for(lambda: listening_addresses(port) or not exporter.alive(), 15,
                 message=lambda: f"the exporter to listen; log:\n{exporter.log()}")
        assert listening_addresses(port) == {"0100007F"}, exporter.log()
