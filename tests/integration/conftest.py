"""A real cluster for integration tests: a Celery control worker with beat and node agents
with simulated GPUs, as separate processes, on PostgreSQL and Redis.

The test process commits for real (``transactional_db``), so the worker sees its rows; the
worker and the agents talk through Redis exactly as in production.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


#: Tests here that need no PostgreSQL, Redis or worker (they drive an agent in process):
#: they run in the plain SQLite suite too.
SELF_CONTAINED = ("tests/integration/test_job_isolation.py",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath).replace(os.sep, "/")
        if "tests/integration/" in path and not path.endswith(SELF_CONTAINED):
            item.add_marker(pytest.mark.integration)


def _database_url() -> str:
    db = connection.settings_dict
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class Cluster:
    """Starts and stops the processes of one test; ``wait_for`` polls the database."""

    def __init__(self, tmp_path: Path, work: Path) -> None:
        self.tmp = tmp_path
        #: The agents' work dirs: job accounts must reach them (pytest's tmp_path is 0700).
        self.work = work
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": _database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "REDIS_URL": os.environ.get("REDIS_URL", settings.CELERY_BROKER_URL),
            "SLUICE_VAR_DIR": str(settings.VAR_DIR),
            "SLUICE_LOG_DIR": str(settings.SLUICE_LOG_DIR),
            "SLUICE_DISPATCH_INTERVAL": "1",
            "SLUICE_CONTROL_INTERVAL": "1",
            "SLUICE_NODE_LOST_SECONDS": "6",
            "SLUICE_STUCK_LAUNCH_SECONDS": "30",
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
        }

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_worker(self) -> None:
        self._spawn(
            "worker",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "--queues",
                "dispatch,reports,control",
                "--concurrency",
                "2",
                "--beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.tmp / "beat-schedule"),
            ],
        )

    def start_agent(self, node: str, pool: str = "training", simulate: str = "4xH100-80GB") -> None:
        self._spawn(
            f"agent-{node}",
            [
                sys.executable,
                "-m",
                "scheduling.agent",
                "--node",
                node,
                "--pool",
                pool,
                "--simulate",
                simulate,
                "--broker",
                settings.CELERY_BROKER_URL,
                "--work-dir",
                str(self.work / node),
                "--heartbeat",
                "1",
                # As root (CI) jobs run as their tenant's account, made on first use.
                "--create-accounts",
            ],
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def kill_jobs(self) -> None:
        """Jobs outlive their agent by design; the test ends them (their wrapper leads the group)."""
        for state in self.work.glob("*/jobs/*/state.json"):
            try:
                pid = json.loads(state.read_text()).get("pid")
                if pid:
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            # Whatever is left of its group: a Celery pool process busy with a task can
            # outlive its parent's warm shutdown and was left running after the tests.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(
            f"----- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            connection.close()  # see other processes' commits
            value = predicate()
            if value:
                return value
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")


@pytest.fixture
def cluster(transactional_db, tmp_path, settings):
    if connection.vendor != "postgresql" or not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip(
            "integration tests need PostgreSQL (DATABASE_URL) and Redis (CELERY_BROKER_URL); see .ci/run"
        )
    settings.SLUICE_NODE_TRANSPORT = "broker"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    from portal.celery import app

    app.conf.task_always_eager = False
    work = Path(tempfile.mkdtemp(prefix="sluice-it-", dir="/var/tmp"))
    work.chmod(0o711)
    c = Cluster(tmp_path, work)
    c.start_worker()
    yield c
    c.stop_all()
    c.kill_jobs()
    app.conf.task_always_eager = True
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def it_world(transactional_db):
    """Tenants, classes, policies, a pool and a queue, but no nodes: the agents register them."""
    from scheduling.choices import WorkloadType
    from tenants.choices import Role
    from tests import factories as f

    tenant = f.TenantFactory(slug="nlp")
    member = f.UserFactory(username="nlp-member")
    f.MembershipFactory(user=member, tenant=tenant, role=Role.ADMIN)
    pool = f.PoolFactory(name="training")
    normal = f.PriorityClassFactory(name="normal", value=400)
    low = f.PriorityClassFactory(name="low", value=200, preemptible=True)
    high = f.PriorityClassFactory(name="high", value=600, can_preempt=True)
    for wt in WorkloadType.values:
        f.policy(wt, stop_grace_seconds=3, min_runtime_before_preemption_seconds=0)
    f.QuotaFactory(tenant=tenant, pool=pool, guaranteed_gpus=4, borrow_limit_gpus=4)
    project = f.ProjectFactory(tenant=tenant, slug="llm")
    queue = f.QueueFactory(
        tenant=tenant,
        name="train",
        pool=pool,
        default_priority_class=normal,
        max_self_service_class=high,
    )
    return {
        "tenant": tenant,
        "member": member,
        "pool": pool,
        "project": project,
        "queue": queue,
        "normal": normal,
        "low": low,
        "high": high,
    }
