"""End-to-end benchmark: real web, workers and agents, driven through the API (DESIGN §11).

    .venv/bin/python bench/e2e.py [--backend auto|postgres|embedded] [--jobs 1000] [--big]
                                  [--skip FIGURE ...] [--clients-seconds 60] [--keep]
                                  [--beside-slurm]

Starts its own cluster, as ``make run``'s Procfile does but in a temporary folder with its
own database: gunicorn (``portal.wsgi``, 2 workers × 4 threads, a free port), the
``dispatcher`` Celery worker (queue ``dispatch``), the ``worker`` (queues ``reports`` and
``control``, with beat) and 4 node agents × 8 simulated H100 GPUs in one pool. Settings are
production-like (``DEBUG=0``) with ``SLUICE_DISPATCH_INTERVAL=1``. Where the PostgreSQL
server has autovacuum off (as this machine's CI configuration has), the bench vacuums its
database every ``--vacuum-every`` seconds (60, autovacuum's default naptime) and before each
figure, as production's autovacuum would (see ``Vacuumer``); each line says which.

Backends: ``postgres`` is PostgreSQL (a fresh database, dropped at the end) and Redis (an
empty database number, flushed at the end); ``embedded`` is SQLite and the filesystem
broker in the temporary folder; ``auto`` takes PostgreSQL + Redis when both answer.

Figures (one JSON line each, then a table), jobs of one GPU running ``true``:

* ``idle_start``: on an idle cluster, 20 jobs (``sleep 1``) one after another: submit →
  the API shows RUNNING (the job polled every ~20 ms), median and max; ``idle_start_events``:
  the same from the job's own timestamps (``started_at`` − ``submitted_at``).
* ``drain_bulk``: N jobs in one ``POST /api/v1/jobs/bulk``; jobs/s from the request to the
  last job finished (read through the API every 0.2 s). With ``--beside-slurm`` (root,
  Slurm and munge installed), an emulated Slurm cluster of the same size
  (``tools/slurm_cluster.py``) drains the same N jobs straight after, as
  ``bench/slurm_drain.py`` does (``sbatch`` from 8 threads): ``slurm_drain`` and
  ``drain_ratio_to_slurm`` (Sluice's rate over Slurm's, same run; target ≥ 15).
* ``drain_single``: N jobs as single ``POST /api/v1/jobs/`` from 8 client threads; drain
  jobs/s, and ``single_post_rate`` (jobs/s over the POSTs alone); ``single_post_seq``: 200
  single POSTs in a row from one client.
* ``drain_10k`` (``--big``): 10 × N jobs in bulk requests of N; drain time and its ratio to
  ``drain_bulk``'s.
* ``clients_60s``: 20 client threads, each alternately submitting one job and listing jobs,
  while 1,000 jobs of another tenant wait in the same pool (its quota is taken by one
  sleeping job); submit latency p50/p95/p99, list p99, errors.

Everything it started is stopped at the end, on errors and on Ctrl-C. ``--keep`` leaves the
temporary folder (process logs); on failure the tail of each log is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIGURES = ("idle_start", "drain_bulk", "drain_single", "drain_10k", "clients_60s")
NODES = 4
GPUS_PER_NODE = 8
GPU_SPEC = f"{GPUS_PER_NODE}xH100-80GB"
POOL = "e2e"
END_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "RECLAIMED", "PREEMPTED", "LOST")
ACTIVE_STATES = ("PENDING", "ADMITTED", "RUNNING", "STOPPING")
#: Projects of the main tenant, one per figure, so that each figure counts its own jobs.
PROJECTS = ("warmup", "idle", "bulk", "single", "seq", "big", "clients")
IDLE_JOBS = 20
SEQ_POSTS = 200
SINGLE_THREADS = 8
CLIENTS = 20
PENDING_KEPT = 1000
POLL_SECONDS = 0.2
IDLE_POLL_SECONDS = 0.02
#: What the summary table shows of each figure's JSON line, besides its value.
TABLE_DETAILS = (
    "seconds",
    "max",
    "admitted_median",
    "ratio_to_drain_bulk",
    "complete",
    "failed",
    "submit_p50",
    "submit_p95",
    "list_p99",
    "submit_rate",
    "errors",
    "post_errors",
)
#: Targets (docs/benchmarks.md) on a 2-core machine.
DRAIN_TARGET = {"postgres+redis": 55.0, "embedded": 20.0}


def log(message: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --- backends -------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str  # "postgres+redis" or "embedded"
    database_url: str = ""
    redis_url: str = ""
    admin_url: str = ""  # the postgres database to create and drop from

    @property
    def database_name(self) -> str:
        return self.database_url.rpartition("/")[2]


def _postgres_answers(base: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(f"{base}/postgres", connect_timeout=3):
            return True
    except (psycopg.Error, OSError):
        return False


def _free_redis_db(url: str) -> int | None:
    """An empty Redis database number (15 down to 1), or None when Redis does not answer."""
    import redis

    try:
        for number in range(15, 0, -1):
            client = redis.Redis.from_url(f"{url}/{number}", socket_timeout=3)
            if client.dbsize() == 0:
                return number
    except (redis.RedisError, OSError, ValueError):
        return None
    return None


def _database_errors() -> tuple[type[Exception], ...]:
    """The errors of PostgreSQL and Redis clients (a server that went away, a refusal)."""
    import psycopg
    import redis

    return (psycopg.Error, redis.RedisError)


def choose_backend(choice: str, postgres: str, redis_url: str) -> Backend:
    if choice in ("auto", "postgres"):
        number = _free_redis_db(redis_url) if _postgres_answers(postgres) else None
        if number is not None:
            name = f"sluice_e2e_{os.getpid()}_{int(time.time())}"
            return Backend(
                "postgres+redis",
                database_url=f"{postgres}/{name}",
                redis_url=f"{redis_url}/{number}",
                admin_url=f"{postgres}/postgres",
            )
        if choice == "postgres":
            raise BenchError(f"PostgreSQL ({postgres}) or Redis ({redis_url}) does not answer")
        log("PostgreSQL or Redis does not answer: embedded backend (SQLite, filesystem broker)")
    return Backend("embedded")


class Vacuumer:
    """Stands in for PostgreSQL's autovacuum where the server has it off (this machine's
    CI configuration does: ``conf.d/90-ci.conf``), as production would not: ``VACUUM
    (ANALYZE)`` of the bench's database every ``every`` seconds, as autovacuum visits a
    database once per ``autovacuum_naptime`` (60 s by default) when its tables churn, and
    once before each figure (the quiet minute between two bursts). Every job updates its
    row four or five times: without vacuum, 1,000 waiting jobs read 25,000 index entries
    and the job table's statistics stay those of an empty table. Its CPU counts as
    PostgreSQL's. Nothing is done when the server vacuums itself, or with ``every`` 0."""

    def __init__(self, backend: Backend, every: float) -> None:
        self.url = backend.database_url if backend.name != "embedded" else ""
        self.every = every
        self.server = self._server_setting() if self.url else ""
        self.active = bool(self.url) and self.server == "off" and every > 0
        self.runs = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _server_setting(self) -> str:
        import psycopg

        base = self.url.rpartition("/")[0]
        with psycopg.connect(f"{base}/postgres", connect_timeout=3) as conn:
            return str(conn.execute("SHOW autovacuum").fetchone()[0])

    @property
    def label(self) -> str:
        if not self.url:
            return "embedded"
        if self.server != "off":
            return "server autovacuum"
        return f"bench every {self.every:g} s" if self.active else "none (autovacuum off)"

    def now(self) -> None:
        if not self.active:
            return
        import psycopg

        with self._lock, psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
            self.runs += 1

    def _loop(self) -> None:
        import psycopg

        while not self._stop.wait(self.every):
            try:
                self.now()
            except (psycopg.Error, OSError) as exc:  # the database is being dropped, or restarts
                log(f"vacuum failed: {exc}")

    def start(self) -> None:
        if self.active:
            self._thread = threading.Thread(target=self._loop, name="vacuum", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


# --- the cluster ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """The processes of one run, each in its own process group, logging to the temp folder."""

    def __init__(self, backend: Backend, tmp: Path) -> None:
        self.backend = backend
        self.tmp = tmp
        self.var = tmp / "var"
        self.var.mkdir()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.database_created = False
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SLUICE_BROKER_DIR"}
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "portal.settings",
                "DEBUG": "0",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                # Plain HTTP on the loopback: no TLS proxy in front to redirect to.
                "SECURE_SSL_REDIRECT": "0",
                "CELERY_TASK_ALWAYS_EAGER": "0",
                "SLUICE_VAR_DIR": str(self.var),
                "SLUICE_LOG_DIR": str(self.var / "logs"),
                "SLUICE_AUDIT_ANCHOR": str(self.var / "audit-anchor.json"),
                "SLUICE_DISPATCH_INTERVAL": "1",
                "SLUICE_NODE_TRANSPORT": "broker",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if backend.name == "embedded":
            env["CELERY_BROKER_URL"] = "filesystem://"
            env["SLUICE_BROKER_DIR"] = str(self.var / "broker")
        else:
            env["DATABASE_URL"] = backend.database_url
            env["CELERY_BROKER_URL"] = backend.redis_url
            env["REDIS_URL"] = backend.redis_url
        self.env = env

    # processes

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.tmp / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                args,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def run(self, name: str, args: list[str], timeout: float = 600) -> str:
        """Run a one-off command (migrate, seed) to its end; its output is returned."""
        result = subprocess.run(
            args, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        (self.tmp / f"{name}.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise BenchError(f"{name} failed:\n{(result.stdout + result.stderr)[-4000:]}")
        return result.stdout

    def prepare_database(self) -> None:
        if self.backend.name != "embedded":
            import psycopg
            import redis

            with psycopg.connect(self.backend.admin_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.backend.database_name}"')
            self.database_created = True
            redis.Redis.from_url(self.backend.redis_url).flushdb()
        self.run("migrate", [sys.executable, "manage.py", "migrate", "--noinput"])

    def seed(self) -> dict:
        out = self.run("seed", [sys.executable, str(Path(__file__).resolve()), "--seed-only"])
        return json.loads(out.strip().splitlines()[-1])

    def start(self) -> None:
        self.start_control_plane()
        self.start_agents()

    def start_control_plane(self) -> None:
        """gunicorn, the dispatcher and the worker with beat, as the Procfile lays them out."""
        py = sys.executable
        self._spawn(
            "web",
            [
                py,
                "-m",
                "gunicorn",
                "portal.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--access-logfile",
                "-",
            ],
        )
        celery = [py, "-m", "celery", "-A", "portal", "worker", "--loglevel", "INFO"]
        self._spawn(
            "dispatcher",
            [*celery, "--queues", "dispatch", "--concurrency", "1", "--hostname", "dispatcher@%h"],
        )
        self._spawn(
            "worker",
            [
                *celery,
                "--queues",
                "reports,control",
                "--concurrency",
                "2",
                "--beat",
                "--schedule",
                str(self.var / "celerybeat-schedule"),
                "--hostname",
                "worker@%h",
            ],
        )

    def start_agents(self) -> None:
        py = sys.executable
        agent_dir = self.var / "agent"
        agent_dir.mkdir(mode=0o711, exist_ok=True)
        agent_dir.chmod(0o711)  # job accounts pass through to their job directories
        for i in range(1, NODES + 1):
            node = f"e2e-{i}"
            args = [
                py,
                "-m",
                "scheduling.agent",
                "--node",
                node,
                "--pool",
                POOL,
                "--simulate",
                GPU_SPEC,
                "--broker",
                self.env["CELERY_BROKER_URL"],
                "--work-dir",
                str(agent_dir / node),
            ]
            if self.backend.name == "embedded":
                args += ["--broker-dir", self.env["SLUICE_BROKER_DIR"]]
            self._spawn(f"agent-{node}", args)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each started process has used so far, with all its
        descendants: the live ones and those it reaped (a job's ``true`` and its wrapper
        count for their agent). Agents are summed as ``agents``; PostgreSQL and Redis, not
        started here, are read by name (``postgres``, ``redis``) when this user sees them."""
        tick = os.sysconf("SC_CLK_TCK")
        stats: dict[int, tuple[int, int, str]] = {}  # pid -> (ppid, ticks incl. reaped, comm)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    data = f.read()
            except OSError:
                continue
            comm = data[data.index("(") + 1 : data.rindex(")")]
            fields = data[data.rindex(")") + 2 :].split()
            ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
            stats[int(entry)] = (int(fields[1]), ticks, comm)
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)

        def tree(pid: int) -> int:
            total, todo = 0, [pid]
            while todo:
                current = todo.pop()
                total += stats.get(current, (0, 0, ""))[1]
                todo += children.get(current, [])
            return total

        out: dict[str, float] = {}
        for name, proc in self.procs.items():
            key = "agents" if name.startswith("agent") else name
            out[key] = out.get(key, 0.0) + tree(proc.pid) / tick
        for service in ("postgres", "redis-server"):
            ticks = sum(t for _, t, comm in stats.values() if comm.startswith(service))
            if ticks:
                out[service.split("-")[0]] = ticks / tick
        own = os.times()
        out["bench_client"] = own.user + own.system
        with open("/proc/stat") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
        out["machine"] = (sum(cpu) - cpu[3] - cpu[4]) / tick  # all but idle and iowait
        return out

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise BenchError(f"process {name} exited with status {proc.returncode}")

    def stop(self) -> None:
        # Agents first (no new reports), then the workers, then the web server.
        for name in sorted(self.procs, key=lambda n: (not n.startswith("agent"), n)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        self._kill_jobs()

    def _kill_jobs(self) -> None:
        """Jobs outlive their agent by design (the next agent adopts them): end them here."""
        for state in (self.var / "agent").glob("*/jobs/*/state.json"):
            try:
                pid = json.loads(state.read_text()).get("pid")
                if pid:
                    os.killpg(int(pid), signal.SIGKILL)
            except (OSError, ValueError, TypeError):
                pass

    def drop(self) -> None:
        if self.backend.name == "embedded":
            return
        import redis

        with contextlib.suppress(redis.RedisError, OSError):
            redis.Redis.from_url(self.backend.redis_url).flushdb()
        if self.database_created:
            import psycopg

            with psycopg.connect(self.backend.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.backend.database_name}" WITH (FORCE)')

    def log_tails(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(f"----- {path.name} (last {chars} characters)\n{text[-chars:]}")
        return "\n".join(parts)


# --- seeding (runs in a subprocess with the cluster's environment) ---------------------------


def seed() -> dict:
    """The bench's world, made through the services: a platform admin, tenant ``e2e``
    (32 GPUs guaranteed in pool ``e2e``) with one project per figure, and tenant
    ``e2e-blocked`` (1 GPU guaranteed) whose jobs wait behind one sleeping job."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    import scheduling.tasks  # noqa: F401 - registers the dispatch task the services request
    from accounts.services import api_token_create
    from scheduling.choices import WorkloadType
    from scheduling.services import config
    from tenants import services as tenants

    User = get_user_model()
    admin = User.objects.create_superuser("e2e-admin", password=secrets.token_urlsafe(16))
    user = tenants.user_create(actor=admin, username="e2e-user", password=secrets.token_urlsafe(16))
    pool = config.pool_save(actor=admin, name=POOL, description="End-to-end benchmark pool")
    normal = config.priority_class_save(actor=admin, name="normal", value=400)
    config.workload_policy_save(
        actor=admin,
        workload_type=WorkloadType.TRAINING,
        preemptible=False,
        default_runtime_seconds=600,
        max_runtime_seconds=2 * 86400,
        stop_grace_seconds=5,
    )
    # As root the agents run jobs as the tenant's Unix account: an existing unprivileged
    # one, so that no account is created on this machine.
    unix_account = "nobody" if os.geteuid() == 0 else ""
    world: dict[str, Any] = {"projects": {}}
    for slug, gpus in (("e2e", NODES * GPUS_PER_NODE), ("e2e-blocked", 1)):
        tenant = tenants.tenant_create(actor=admin, slug=slug, name=slug)
        if unix_account:
            tenants.tenant_update(actor=admin, tenant=tenant, unix_account=unix_account)
        tenants.membership_add(actor=admin, tenant=tenant, user=user, role="admin")
        config.quota_save(
            actor=admin, tenant=tenant, pool=pool, guaranteed_gpus=gpus, borrow_limit_gpus=0
        )
        queue = config.queue_save(
            actor=admin,
            tenant=tenant,
            name="q",
            pool=pool,
            default_priority_class=normal,
            max_self_service_class=normal,
        )
        world["blocked_queue" if slug == "e2e-blocked" else "queue"] = queue.pk
        for project_slug in PROJECTS if slug == "e2e" else ("blocked",):
            project = tenants.project_create(
                actor=admin, tenant=tenant, slug=project_slug, name=project_slug
            )
            world["projects"][project_slug] = project.pk
    _, world["token"] = api_token_create(user=user, name="e2e bench", expires_in_days=1)
    return world


# --- the API client ---------------------------------------------------------------------------


class ApiError(BenchError):
    """The API answered with an unexpected status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


#: What a call to the API may raise when the server is not answering yet, answers an
#: error status, or answers something that is not JSON: the benches' waiting loops and
#: client threads catch these, never ``Exception`` (which would hide an ImportError or a
#: NameError as "the server did not answer").
API_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    http.client.HTTPException,
    ValueError,
    ApiError,
)


class Api:
    """A thin JSON client on the standard library: one kept-alive connection per thread."""

    def __init__(self, url: str, token: str) -> None:
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.prefix = parts.path.rstrip("/") + "/api/v1"
        self.url = f"{url.rstrip('/')}/api/v1"
        self.token = token
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(
        self, method: str, target: str, body: dict | None = None, timeout: float = 60
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ``target`` is a path under the API, or a full URL
        (a page's ``next``). A kept-alive connection the server closed is opened again once."""
        if target.startswith(("http://", "https://")):
            parts = urllib.parse.urlsplit(target)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
        else:
            path = f"{self.prefix}/{target}"
        headers = {"Authorization": f"Token {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn = self._connection(timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop_connection()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                self._drop_connection()
                raise
            if response.will_close:
                self._drop_connection()
            return response.status, payload
        raise AssertionError("unreachable")

    def get(self, path: str, **params) -> Any:
        if params:
            path = f"{path}?{urllib.parse.urlencode(params, doseq=True)}"
        status, payload = self.request("GET", path, timeout=60)
        if status != 200:
            raise ApiError(f"GET {path}: {status} {payload[:500].decode(errors='replace')}", status)
        return json.loads(payload)

    def post(self, path: str, body: dict) -> Any:
        status, payload = self.request("POST", path, body, timeout=600)
        if status not in (200, 201):
            raise ApiError(
                f"POST {path}: {status} {payload[:500].decode(errors='replace')}", status
            )
        return json.loads(payload)

    def count(self, **params) -> int:
        return self.get("jobs/", page_size=1, **params)["count"]


def _spec(world: dict, project: str, command: list[str], **extra) -> dict:
    queue = world["blocked_queue"] if project == "blocked" else world["queue"]
    return {
        "project": world["projects"][project],
        "queue": queue,
        "name": f"e2e-{project}",
        "workload_type": "training",
        "command": command,
        "gpus_per_node": 1,
        "max_runtime_seconds": 600,
        **extra,
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)  # nearest rank
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# --- the run --------------------------------------------------------------------------------


@dataclass
class Drain:
    """How a drain went: seconds from the first submission, jobs ended, all of them or not."""

    seconds: float
    ended: int
    complete: bool

    @property
    def rate(self) -> float:
        return self.ended / self.seconds

    def fields(self) -> dict:
        extra = {} if self.complete else {"complete": False, "ended": self.ended}
        return {"seconds": round(self.seconds, 2), **extra}


@dataclass
class Bench:
    cluster: Cluster
    api: Api
    world: dict
    jobs: int
    clients_seconds: float
    drain_timeout: float | None = None
    vacuum: str = ""
    results: list[dict] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.cluster.backend.name

    def emit(self, figure: str, value: float, unit: str, target: str, ok: bool | None, **extra):
        line = {
            "figure": figure,
            "value": round(value, 3),
            "unit": unit,
            "backend": self.backend,
            "target": target,
            "meets_target": ok,
            **extra,
            "vacuum": self.vacuum,
        }
        self.results.append(line)
        print(json.dumps(line), flush=True)

    def cpu_since(self, before: dict[str, float], jobs: int | None = None) -> dict:
        """CPU seconds by process since ``before`` (see ``Cluster.cpu_seconds``), and per
        job in milliseconds when ``jobs`` is given: where a figure's time went."""
        after = self.cluster.cpu_seconds()
        used = {k: round(after[k] - before.get(k, 0.0), 2) for k in after}
        fields: dict[str, Any] = {"cpu_seconds": used}
        if jobs:
            fields["cpu_ms_per_job"] = {k: round(1000 * v / jobs, 1) for k, v in used.items()}
        return fields

    # waiting

    def wait_nodes(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.cluster.check_alive()
            try:
                nodes = self.api.get("nodes/", page_size=50)
                ready = [n for n in nodes["results"] if n.get("state") == "ready"]
                if len(ready) >= NODES:
                    return
            except API_ERRORS:  # the web server is still starting
                pass
            time.sleep(0.5)
        raise BenchError(f"the {NODES} nodes did not register within {timeout:.0f} s")

    def ended(self, project: str) -> int:
        return self.api.count(project=self.world["projects"][project], state=list(END_STATES))

    def wait_drained(self, project: str, expected: int, t0: float, jobs: int) -> Drain:
        """Polls until ``expected`` jobs of the project ended, or the drain timeout for
        ``jobs`` passed: then the jobs left are cancelled and the drain is incomplete."""
        timeout = self.drain_timeout or 120 + jobs / 2
        deadline = time.monotonic() + timeout
        last_check = 0.0
        while True:
            ended = self.ended(project)
            now = time.monotonic()
            if ended >= expected:
                return Drain(now - t0, ended, complete=True)
            if now > deadline:
                log(f"{project}: {ended}/{expected} jobs ended after {timeout:.0f} s: cancelling")
                self.cancel_active(project)
                return Drain(now - t0, ended, complete=False)
            if now - last_check > 5:
                self.cluster.check_alive()
                last_check = now
            time.sleep(POLL_SECONDS)

    def cancel_active(self, project: str) -> None:
        """Cancel the project's jobs not ended (from 8 threads), so the next figure starts idle."""
        ids: list[int] = []
        page = self.api.get(
            "jobs/", project=self.world["projects"][project], state=list(ACTIVE_STATES)
        )
        while True:
            ids += [job["id"] for job in page["results"]]
            if not page.get("next"):
                break
            page = self.api.get(page["next"])
        todo = iter(ids)
        lock = threading.Lock()

        def canceller() -> None:
            while True:
                with lock:
                    job = next(todo, None)
                if job is None:
                    return
                with contextlib.suppress(*API_ERRORS):
                    self.api.post(f"jobs/{job}/cancel", {"reason": "drain timed out"})

        threads = [threading.Thread(target=canceller, daemon=True) for _ in range(SINGLE_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def wait_idle(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.api.count(state=list(ACTIVE_STATES)) > 0:
            if time.monotonic() > deadline:
                raise BenchError("the cluster did not become idle")
            self.cluster.check_alive()
            time.sleep(0.5)

    def failed(self, project: str) -> int:
        return self.api.count(
            project=self.world["projects"][project],
            state=[s for s in END_STATES if s != "SUCCEEDED"],
        )

    # figures

    def warmup(self) -> None:
        spec = _spec(self.world, "warmup", ["true"])
        self.api.post("jobs/bulk", {"jobs": [spec] * 8})
        self.wait_drained("warmup", 8, time.monotonic(), 8)
        self.wait_idle()

    def idle_start(self) -> None:
        polled, events, admitted = [], [], []
        seen_running = 0
        for _ in range(IDLE_JOBS):
            self.wait_idle()
            spec = _spec(self.world, "idle", ["sleep", "1"])
            t0 = time.monotonic()
            job = self.api.post("jobs/", spec)
            deadline = t0 + 60
            while True:
                state = self.api.get(f"jobs/{job['id']}/")["state"]
                if state == "RUNNING" or state in END_STATES:
                    polled.append(time.monotonic() - t0)
                    seen_running += state == "RUNNING"
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"job {job['id']} not running after 60 s (state {state})")
                time.sleep(IDLE_POLL_SECONDS)
            while (detail := self.api.get(f"jobs/{job['id']}/"))["state"] not in END_STATES:
                time.sleep(0.05)
            submitted = datetime.fromisoformat(detail["submitted_at"])
            if detail["started_at"]:
                events.append(
                    (datetime.fromisoformat(detail["started_at"]) - submitted).total_seconds()
                )
            if detail["admitted_at"]:
                admitted.append(
                    (datetime.fromisoformat(detail["admitted_at"]) - submitted).total_seconds()
                )
        median = statistics.median(polled)
        self.emit(
            "idle_start",
            median,
            "s",
            "median ≤ 0.25",
            median <= 0.25,
            max=round(max(polled), 3),
            jobs=IDLE_JOBS,
            seen_running=seen_running,
            how="client: POST → GET shows RUNNING, polled every ~20 ms",
        )
        if events:
            median = statistics.median(events)
            self.emit(
                "idle_start_events",
                median,
                "s",
                "median ≤ 0.25",
                median <= 0.25,
                max=round(max(events), 3),
                admitted_median=round(statistics.median(admitted), 3) if admitted else None,
                jobs=len(events),
                how="job timestamps: started_at (agent) − submitted_at",
            )

    def drain_bulk(self) -> float | None:
        self.wait_idle()
        specs = [_spec(self.world, "bulk", ["true"])] * self.jobs
        cpu = self.cluster.cpu_seconds()
        t0 = time.monotonic()
        self.api.post("jobs/bulk", {"jobs": specs})
        posted = time.monotonic() - t0
        drain = self.wait_drained("bulk", self.jobs, t0, self.jobs)
        target = DRAIN_TARGET[self.backend]
        self.emit(
            "drain_bulk",
            drain.rate,
            "jobs/s",
            f"≥ {target:g}",
            drain.rate >= target,
            jobs=self.jobs,
            **drain.fields(),
            submit_seconds=round(posted, 2),
            failed=self.failed("bulk"),
            **self.cpu_since(cpu, self.jobs),
        )
        return drain.seconds if drain.complete else None

    def drain_single(self) -> None:
        self.wait_idle()
        spec = _spec(self.world, "single", ["true"])
        remaining = iter(range(self.jobs))
        lock = threading.Lock()
        errors: list[str] = []

        def client() -> None:
            while True:
                with lock:
                    if next(remaining, None) is None:
                        return
                try:
                    self.api.post("jobs/", spec)
                except API_ERRORS as exc:
                    errors.append(str(exc)[:200])

        threads = [threading.Thread(target=client, daemon=True) for _ in range(SINGLE_THREADS)]
        cpu = self.cluster.cpu_seconds()
        t0 = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        posted = time.monotonic() - t0
        cpu_posting = self.cpu_since(cpu, self.jobs)
        submitted = self.jobs - len(errors)
        drain = self.wait_drained("single", submitted, t0, self.jobs)
        target = DRAIN_TARGET[self.backend]
        self.emit(
            "drain_single",
            drain.rate,
            "jobs/s",
            f"≥ {target:g}",
            drain.rate >= target,
            jobs=submitted,
            **drain.fields(),
            post_errors=len(errors),
            failed=self.failed("single"),
            clients=SINGLE_THREADS,
            **self.cpu_since(cpu, submitted),
        )
        self.emit(
            "single_post_rate",
            submitted / posted,
            "jobs/s",
            "≥ 100",
            submitted / posted >= 100,
            jobs=submitted,
            seconds=round(posted, 2),
            clients=SINGLE_THREADS,
            errors=len(errors),
            **cpu_posting,
        )
        if errors:
            log(f"single POST errors (first): {errors[0]}")
        # 200 single submissions in a row, from one client, on the now idle cluster.
        self.wait_idle()
        spec = _spec(self.world, "seq", ["true"])
        cpu = self.cluster.cpu_seconds()
        t0 = time.monotonic()
        for _ in range(SEQ_POSTS):
            self.api.post("jobs/", spec)
        seconds = time.monotonic() - t0
        cpu_posting = self.cpu_since(cpu, SEQ_POSTS)
        self.emit(
            "single_post_seq",
            SEQ_POSTS / seconds,
            "jobs/s",
            "≥ 100",
            SEQ_POSTS / seconds >= 100,
            jobs=SEQ_POSTS,
            seconds=round(seconds, 2),
            clients=1,
            **cpu_posting,
        )
        self.wait_drained("seq", SEQ_POSTS, t0, SEQ_POSTS)

    def drain_big(self, one_batch_seconds: float | None) -> None:
        self.wait_idle()
        total = 10 * self.jobs
        specs = [_spec(self.world, "big", ["true"])] * self.jobs
        cpu = self.cluster.cpu_seconds()
        t0 = time.monotonic()
        for _ in range(10):
            self.api.post("jobs/bulk", {"jobs": specs})
        posted = time.monotonic() - t0
        drain = self.wait_drained("big", total, t0, total)
        ratio = drain.seconds / one_batch_seconds if one_batch_seconds and drain.complete else None
        self.emit(
            "drain_10k",
            drain.rate,
            "jobs/s",
            "time ≤ 12× drain_bulk's",
            ratio <= 12 if ratio is not None else None,
            jobs=total,
            **drain.fields(),
            ratio_to_drain_bulk=round(ratio, 2) if ratio is not None else None,
            submit_seconds=round(posted, 2),
            bulk_requests=10,
            failed=self.failed("big"),
            **self.cpu_since(cpu, total),
        )

    def clients(self) -> None:
        self.wait_idle()
        blocker = self.api.post(
            "jobs/", _spec(self.world, "blocked", ["sleep", "3600"], max_runtime_seconds=7200)
        )
        deadline = time.monotonic() + 60
        while self.api.get(f"jobs/{blocker['id']}/")["state"] != "RUNNING":
            if time.monotonic() > deadline:
                raise BenchError("the blocking job did not start")
            time.sleep(0.2)
        pending = [_spec(self.world, "blocked", ["true"])] * PENDING_KEPT
        self.api.post("jobs/bulk", {"jobs": pending})
        blocked = self.world["projects"]["blocked"]
        time.sleep(3)  # a few dispatch cycles see them
        pending_before = self.api.count(project=blocked, state="PENDING")
        spec = _spec(self.world, "clients", ["true"])
        submit_s: list[float] = []
        list_s: list[float] = []
        errors: list[str] = []
        stop_at = time.monotonic() + self.clients_seconds

        def client() -> None:
            while time.monotonic() < stop_at:
                for kind, call in (
                    ("submit", lambda: self.api.post("jobs/", spec)),
                    ("list", lambda: self.api.get("jobs/")),
                ):
                    t = time.monotonic()
                    try:
                        call()
                    except API_ERRORS as exc:
                        errors.append(f"{kind}: {str(exc)[:200]}")
                        continue
                    (submit_s if kind == "submit" else list_s).append(time.monotonic() - t)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        cpu = self.cluster.cpu_seconds()
        t0 = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - t0
        cpu_used = self.cpu_since(cpu)
        pending_after = self.api.count(project=blocked, state="PENDING")
        p99 = _percentile(submit_s, 99)
        list_p99 = _percentile(list_s, 99)
        self.emit(
            "clients_60s",
            p99,
            "s (submit p99)",
            "p99 ≤ 1 s, 0 errors",
            p99 <= 1 and list_p99 <= 1 and not errors,
            clients=CLIENTS,
            seconds=round(seconds, 1),
            submits=len(submit_s),
            submit_rate=round(len(submit_s) / seconds, 1),
            submit_p50=round(_percentile(submit_s, 50), 3),
            submit_p95=round(_percentile(submit_s, 95), 3),
            submit_p99=round(p99, 3),
            lists=len(list_s),
            list_p50=round(_percentile(list_s, 50), 3),
            list_p99=round(list_p99, 3),
            errors=len(errors),
            pending_kept=[pending_before, pending_after],
            **cpu_used,
        )
        if errors:
            log(f"client errors (first): {errors[0]}")
        with contextlib.suppress(*API_ERRORS):
            self.api.post(f"jobs/{blocker['id']}/cancel", {"reason": "benchmark over"})

    def table(self) -> str:
        rows = [("figure", "value", "unit", "target", "meets", "details"), ("---",) * 6]
        for r in self.results:
            meets = {True: "yes", False: "NO", None: "-"}[r["meets_target"]]
            details = ", ".join(f"{k} {r[k]}" for k in TABLE_DETAILS if r.get(k) is not None)
            rows.append((r["figure"], f"{r['value']:g}", r["unit"], r["target"], meets, details))
        return "\n".join("| " + " | ".join(row) + " |" for row in rows)


class SlurmBeside:
    """An emulated Slurm cluster of the bench's size beside Sluice's, for ``--beside-slurm``:
    the same jobs drained straight to Slurm (``bench/slurm_drain.py``'s way), in the same
    run, so that the drain's ratio to Slurm's compares like with like."""

    def __init__(self, directory: Path) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
        import slurm_cluster  # the emulated cluster (tools/)
        import slurm_drain  # the straight drain, timed as that bench times it

        if not slurm_cluster.installed():
            raise BenchError("--beside-slurm: Slurm and munge are not installed")
        if os.geteuid() != 0:
            raise BenchError("--beside-slurm: the emulated Slurm cluster needs root")
        self._cluster, self._drain = slurm_cluster, slurm_drain
        self.directory = directory
        layout = slurm_cluster.start(
            argparse.Namespace(
                dir=str(directory),
                nodes=NODES,
                gpus=GPUS_PER_NODE,
                gpu_type="h100",
                prefix="sb",
                partition=slurm_drain.PARTITION,
                cluster="beside",
            )
        )
        self.side = slurm_drain.SlurmSide(layout["slurm_conf"], directory.parent / "straight")
        log(f"Slurm beside: {len(layout['nodes'])} nodes × {layout['gpus']} GPUs; warming up")
        slurm_drain.slurm_drain(self.side, 8, 0)
        slurm_drain.wait_slurm_idle(self.side)

    def drain(self, bench: Bench) -> None:
        """The bench's N jobs straight to Slurm, then the ratio to ``drain_bulk``."""
        bench.wait_idle()
        try:
            self._drain.wait_slurm_idle(self.side)
            straight = self._drain.slurm_drain(self.side, bench.jobs, 1)
        except self._drain.e2e.BenchError as exc:  # that module's copy of this one
            raise BenchError(str(exc)) from exc
        bench.emit("slurm_drain", straight["rate"], "jobs/s", "", None, **straight)
        ours = next((r for r in bench.results if r["figure"] == "drain_bulk"), None)
        if ours is not None and straight["rate"] > 0:
            ratio = ours["value"] / straight["rate"]
            bench.emit("drain_ratio_to_slurm", ratio, "x", "≥ 15", ratio >= 15)

    def stop(self) -> None:
        self._cluster.stop(self.directory)


def _revision() -> str:
    """The commit measured, and whether the working tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "commit unknown"
    if not head:
        return "commit unknown"
    return f"commit {head}" + (" + uncommitted changes" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("auto", "postgres", "embedded"), default="auto")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per drain (default 1000)")
    parser.add_argument("--big", action="store_true", help="also drain 10 × --jobs (minutes)")
    parser.add_argument("--skip", action="append", default=[], choices=FIGURES, metavar="FIGURE")
    parser.add_argument("--clients-seconds", type=float, default=60.0)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        metavar="SECONDS",
        help="give up a drain after this long (default 120 s + 0.5 s a job): its figure is "
        "then the jobs ended so far per second, marked incomplete, and the rest are cancelled",
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="where the PostgreSQL server has autovacuum off: VACUUM (ANALYZE) the bench's "
        "database this often and before each figure, as autovacuum would (default 60; 0: never)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument(
        "--beside-slurm",
        action="store_true",
        help="after drain_bulk, drain the same jobs on an emulated Slurm cluster of the same "
        "size and print the ratio (root, Slurm and munge needed)",
    )
    parser.add_argument("--seed-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_only:
        print(json.dumps(seed()))
        return 0
    skip = set(args.skip) | (set() if args.big else {"drain_10k"})

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    # Also when started with SIGINT ignored (a background job of a script): Ctrl-C, kill
    # and a closed terminal all stop what it started.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    backend = choose_backend(args.backend, args.postgres.rstrip("/"), args.redis.rstrip("/"))
    tmp = Path(tempfile.mkdtemp(prefix="sluice-e2e-", dir="/var/tmp"))
    tmp.chmod(0o711)  # job accounts reach their directories under var/agent/
    cluster = Cluster(backend, tmp)
    vacuumer: Vacuumer | None = None
    slurm: SlurmBeside | None = None
    status = 1
    try:
        if args.beside_slurm:
            slurm = SlurmBeside(tmp / "slurm")
        log(f"backend {backend.name}; temp folder {tmp}")
        cluster.prepare_database()
        vacuumer = Vacuumer(backend, args.vacuum_every)
        log(f"vacuum: {vacuumer.label}")
        world = cluster.seed()
        cluster.start()
        vacuumer.start()
        api = Api(cluster.url, world.pop("token"))
        bench = Bench(
            cluster,
            api,
            world,
            args.jobs,
            args.clients_seconds,
            args.drain_timeout,
            vacuum=vacuumer.label,
        )
        bench.wait_nodes()
        log(f"{NODES} nodes registered at {cluster.url}; warming up")
        bench.warmup()
        one_batch = None
        for figure in FIGURES:
            if figure in skip:
                continue
            log(f"figure {figure}")
            vacuumer.now()
            if figure == "idle_start":
                bench.idle_start()
            elif figure == "drain_bulk":
                one_batch = bench.drain_bulk()
                if slurm is not None:
                    slurm.drain(bench)
            elif figure == "drain_single":
                bench.drain_single()
            elif figure == "drain_10k":
                bench.drain_big(one_batch)
            elif figure == "clients_60s":
                bench.clients()
        print(
            f"\nSluice end to end, {backend.name}, {_revision()}, {os.cpu_count()} CPUs, "
            f"{time.strftime('%Y-%m-%d %H:%M')}, vacuum: {vacuumer.label} ({vacuumer.runs} runs)"
        )
        print(bench.table(), flush=True)
        status = 0
    except KeyboardInterrupt:
        log("interrupted")
        status = 130
    except (BenchError, *API_ERRORS, subprocess.SubprocessError) as exc:
        # Anything else (a bug, a missing module) ends with its traceback, after the clean-up.
        log(f"FAILED: {exc}")
        print(cluster.log_tails(), file=sys.stderr)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # let the clean-up finish
        log("stopping the cluster")
        if vacuumer is not None:
            vacuumer.stop()
        if slurm is not None:
            slurm.stop()
        cluster.stop()
        try:
            cluster.drop()
        except (OSError, *_database_errors()) as exc:
            log(f"could not drop the database: {exc}")
        if args.keep:
            log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
