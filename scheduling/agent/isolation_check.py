"""``sluice-agent check-isolation``: the node agent's isolation, end to end, as root (DESIGN §12).

Starts ``python -m scheduling.agent --node iso-01 --pool check --create-accounts
--heartbeat 1`` as a real process (no Django) over a ``filesystem://`` broker in a
private folder, with its work dir under ``/var/tmp/sluice-isocheck-<pid>`` (0711, so job
accounts can pass through), sends it launches and stops and reads its reports:

  1. ``register``: the backend (nvml on a GPU machine) and its ``isolation`` dict, printed
     verbatim; jobs must run as their own account (we are root).
  2. job A (tenant nlp, run_as sluice-iso-a, GPU 0, its env trying
     ``CUDA_VISIBLE_DEVICES=0,1,2,3`` and ``LD_PRELOAD``) computes for ~15 s (torch matmuls
     on cuda; simulated mode: a CPU busy loop): it runs as sluice-iso-a, sees
     ``CUDA_VISIBLE_DEVICES=0``, no ``LD_PRELOAD``, one device (its UUID GPU 0's), and its
     ``started`` report carries ``isolation``.
  3. heartbeats show GPU 0 > 50 % busy while A computes, A's process on GPU 0 and never
     reported as a zombie (real GPUs only).
  4. job B (tenant vision, run_as sluice-iso-b, no GPU) sees no GPU, then tries to read
     A's state.json (the agent's record of A, its environment included), output.log and
     workspace file, list the jobs dir and A's workspace, read the agent's and A's /proc
     environ (the agent holds SLUICE_ISOCHECK_SECRET), SIGSTOP A and SIGKILL its group
     (a job's launch.json exists only while its launch waits for GPUs): every attempt
     must fail with EACCES/EPERM and A must still run. B opening /dev/nvidia0 (and, on a
     GPU, using GPU 0 after resetting CUDA_VISIBLE_DEVICES itself) is reported as INFO:
     device isolation is a known gap.
  5. cgroup limits {cpus 0.5, memory_mb 256, pids 64} (only where the register report says
     ``cgroup: true``, else SKIP with the agent's note): a job allocating 1 GiB is killed
     (SIGKILL), one starting 200 ``sleep 5`` fails with EAGAIN before 64, one spinning 3 s
     gets at most ~0.6 CPU-second per second.
  6. ``stop`` of A (cancelled, grace 5 s): ``exited`` within grace + 3 s, its group gone.
  7. job D (``log_cap_bytes`` 65536) prints 1 MiB: the shipped log is exactly the first
     65536 bytes, then the protocol's truncation marker, nothing after; D exits 0.
  8. the agent's log holds no traceback (nor ERROR/CRITICAL line).

Prints PASS/FAIL/SKIP/INFO per check, then a JSON summary; with ``--out DIR`` also writes
``isolation_summary.json``, ``agent.log`` and ``reports.jsonl`` there. Exit status 0 when
nothing failed, 1 otherwise, 2 when not run as root.

Run it as root on the node, with the agent installed (its wheel, or a checkout); on a GPU
machine torch and nvidia-ml-py importable too::

    sudo sluice-agent check-isolation --out /tmp/isolation          # ~1 minute

Without a GPU (simulated GPUs, CPU busy loop instead of torch)::

    sudo sluice-agent check-isolation --simulate 1xH100-80GB

(``python -m scheduling.agent check-isolation`` is the same.) The work dir is one job
accounts can pass through: a root agent refuses one in a private 0700 folder such as a
``mkdtemp`` directory.

Mode: real when NVML finds a GPU and ``--simulate`` is not given. Jobs run the
interpreter running the check when job accounts can reach and execute it (every
directory on its resolved path o+x), else ``/usr/bin/python3`` (on a GPU, given this
interpreter's torch folder as PYTHONPATH when only so user nobody finds torch and the
Python versions match; printed either way). At the end the agent is
stopped, leftover job process groups killed and the work dir removed; the Unix accounts
sluice-iso-a and sluice-iso-b (and a ``sluice.slice`` cgroup, where one was made) stay.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: The folder holding the ``scheduling`` package (a checkout, or site-packages where the
#: agent is installed): the agent started here imports it from there.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
NODE = "iso-01"
POOL = "check"
SIM_SPEC = "1xH100-80GB"
ACCOUNT_A, ACCOUNT_B = "sluice-iso-a", "sluice-iso-b"
JOB_A, JOB_B, JOB_C_MEM, JOB_C_PIDS, JOB_C_CPU, JOB_D = 1, 2, 3, 4, 5, 6
LIMITS = {"cpus": 0.5, "memory_mb": 256, "pids": 64}
LOG_CAP = 65536
STOP_GRACE = 5
SECRET_NAME = "SLUICE_ISOCHECK_SECRET"
DENIED = ("denied EACCES", "denied EPERM")
CHECK_2D = "2d A sees one device (torch.cuda.device_count() == 1)"
CHECK_5 = (
    "5a memory limit: C allocating 1 GiB is killed",
    "5b pids limit: fork stops with EAGAIN before 64",
    "5c cpu limit: <= ~0.6 CPU-s per s",
    "5d C's started report carries the limits",
)

# --- the jobs' programs (standard library, plus torch for A and B on a GPU) ------------------

PROG_A = r"""
import json, os, pwd, signal, sys, time

def on_term(signum, frame):
    print("A_SIGTERM %.3f" % time.time(), flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
seconds, real = float(sys.argv[1]), sys.argv[2] == "real"
try:
    user = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    user = None
cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
info = {
    "pid": os.getpid(), "pgid": os.getpgid(0), "uid": os.getuid(), "user": user,
    "CUDA_VISIBLE_DEVICES": cvd,
    "NVIDIA_VISIBLE_DEVICES": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    "LD_PRELOAD_present": "LD_PRELOAD" in os.environ, "cwd": os.getcwd(),
    "visible_count": len([d for d in (cvd or "").split(",") if d]),
}
with open("notes.txt", "w") as f:
    f.write(os.environ.get("ISOCHECK_A_SECRET", ""))
torch = None
if real:
    t0 = time.time()
    try:
        import torch
        info["torch"] = torch.__version__
        info["cuda_available"] = torch.cuda.is_available()
        info["device_count"] = torch.cuda.device_count()
        if info["cuda_available"]:
            props = torch.cuda.get_device_properties(0)
            info["device_name"] = props.name
            info["device_uuid"] = str(props.uuid) if hasattr(props, "uuid") else None
    except Exception as exc:
        torch = None
        info["torch_error"] = repr(exc)
    info["torch_import_s"] = round(time.time() - t0, 1)
print("INFO " + json.dumps(info), flush=True)
cuda = torch is not None and info.get("cuda_available")
if cuda:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = a @ b
    torch.cuda.synchronize()
print("LOOP_START %.3f" % time.time(), flush=True)
end, n = time.time() + seconds, 0
while time.time() < end:
    if cuda:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
    else:
        x = 0
        for i in range(100000):
            x += i * i
    n += 1
print("LOOP_END %.3f iterations=%d" % (time.time(), n), flush=True)
time.sleep(600)
"""

PROG_B = r"""
import errno, json, os, signal, subprocess, sys
real = sys.argv[1] == "real"
a_dir, jobs_dir = os.environ["A_DIR"], os.environ["JOBS_DIR"]
a_pid, a_group = int(os.environ["A_PID"]), int(os.environ["A_GROUP"])
agent_pid = int(os.environ["AGENT_PID"])
out = {
    "uid": os.getuid(),
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "NVIDIA_VISIBLE_DEVICES": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    "env_names": sorted(os.environ),
}
if real:
    try:
        import torch
        out["cuda_available"] = torch.cuda.is_available()
        out["device_count"] = torch.cuda.device_count()
    except Exception as exc:
        out["torch_error"] = repr(exc)

def read(path):
    with open(path, "rb") as f:
        return f.read(64)

def outcome(attempt, ok="ALLOWED"):
    try:
        got = attempt()
    except OSError as exc:
        return "denied " + errno.errorcode.get(exc.errno, str(exc.errno))
    return ok + " " + repr(got)[:120]

attempts = {
    "read A state.json": lambda: read(a_dir + "/state.json"),
    "read A output.log": lambda: read(a_dir + "/output.log"),
    "read A workspace file": lambda: read(a_dir + "/workspace/notes.txt"),
    "list jobs dir": lambda: os.listdir(jobs_dir),
    "read agent /proc environ": lambda: read("/proc/%d/environ" % agent_pid),
    "SIGSTOP A": lambda: os.kill(a_pid, signal.SIGSTOP),
    "list A workspace": lambda: os.listdir(a_dir + "/workspace"),
    "read A /proc environ": lambda: read("/proc/%d/environ" % a_pid),
    "SIGKILL A group": lambda: os.killpg(a_group, signal.SIGKILL),
}
out["attempts"] = {name: outcome(attempt) for name, attempt in attempts.items()}

def open_device():
    fd = os.open("/dev/nvidia0", os.O_RDWR)
    os.close(fd)
    return "read-write"

out["open /dev/nvidia0"] = outcome(open_device, ok="opened")
with open("mine.txt", "w") as f:
    f.write("ok")
out["own workspace"] = open("mine.txt").read()
if real:
    reset = (
        "import os, time, torch; x = torch.zeros(1, device='cuda'); "
        "print(torch.cuda.device_count(), os.getpid(), flush=True); time.sleep(2.5)"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    try:
        p = subprocess.run([sys.executable, "-c", reset], env=env, capture_output=True,
                           text=True, timeout=90)
        out["reset CUDA_VISIBLE_DEVICES=0"] = {
            "rc": p.returncode, "stdout": p.stdout.strip(), "stderr": p.stderr.strip()[-300:]}
    except Exception as exc:
        out["reset CUDA_VISIBLE_DEVICES=0"] = {"error": repr(exc)}
print("RESULTS " + json.dumps(out), flush=True)
"""

PROG_C_MEM = r"""
for i in range(16):
    globals()["chunk%d" % i] = b"\x01" * (64 << 20)
    print("allocated %d MiB" % ((i + 1) * 64), flush=True)
print("MEM_SURVIVED", flush=True)
"""

PROG_C_PIDS = r"""
import errno, json, subprocess
procs, error = [], None
for i in range(200):
    try:
        procs.append(subprocess.Popen(["sleep", "5"]))
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
        break
for p in procs:
    p.kill()
for p in procs:
    p.wait()
print("PIDS " + json.dumps({"started": len(procs), "error": error}), flush=True)
"""

PROG_C_CPU = r"""
import json, resource, time

def used():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def cpu_stat():
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
        path = next(line.split("::", 1)[1] for line in lines if line.startswith("0::"))
        with open("/sys/fs/cgroup" + path + "/cpu.stat") as f:
            return dict(line.split() for line in f)
    except Exception as exc:
        return {"error": repr(exc)}

c0, t0, x = used(), time.monotonic(), 0
while time.monotonic() - t0 < 3.0:
    x += 1
wall, cpu = time.monotonic() - t0, used() - c0
print("CPU " + json.dumps({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                           "cpu_per_s": round(cpu / wall, 3), "cpu.stat": cpu_stat()}),
      flush=True)
"""

PROG_D = r"""
import sys
line = "d" * 1023 + "\n"
for _ in range(1024):
    sys.stdout.write(line)
sys.stdout.flush()
"""


class Timeout(Exception):
    pass


# --- output -------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


class Checks:
    """PASS / FAIL / SKIP / INFO lines, printed as they come."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, status: str | bool, detail: Any) -> None:
        if isinstance(status, bool):
            status = "PASS" if status else "FAIL"
        self.items.append({"check": name, "status": status, "detail": detail})
        print(f"[{status}] {name}: {json.dumps(detail, default=str)}", flush=True)

    def has(self, name: str) -> bool:
        return any(item["check"] == name for item in self.items)

    def count(self, status: str) -> int:
        return sum(1 for item in self.items if item["status"] == status)


# --- reports --------------------------------------------------------------------------------


class Collector:
    """The agent's reports (Celery task messages on the reports queue: batches, or single
    reports from agents that do not batch; heartbeats on the heartbeats queue), validated."""

    def __init__(self, broker_dir: Path, record: Path) -> None:
        from scheduling.agent.protocol import (
            HEARTBEATS_QUEUE,
            REPORT_TASK,
            REPORTS_QUEUE,
            REPORTS_TASK,
            validate_report,
        )
        from scheduling.agent.transport import broker_connection

        self._single, self._batch = REPORT_TASK, REPORTS_TASK
        self._validate = validate_report
        self.connection = broker_connection("filesystem://", broker_dir)
        self.queues = [
            self.connection.SimpleQueue(name, accept=["json"])
            for name in (REPORTS_QUEUE, HEARTBEATS_QUEUE)
        ]
        self.reports: list[dict[str, Any]] = []
        self.invalid: list[str] = []
        self.record = record.open("w")

    def pump(self, seconds: float = 0.0) -> None:
        end = time.monotonic() + seconds
        while True:
            message = self._next()
            if message is None:
                if time.monotonic() >= end:
                    return
                time.sleep(0.05)
                continue
            try:
                task = message.headers.get("task")
                args, _kwargs, _embed = message.payload
                if task == self._batch:
                    batch = list(args[0])
                elif task == self._single:
                    batch = [args[0]]
                else:
                    raise ValueError(f"unexpected task {task!r}")
            except Exception as exc:  # reported as a problem, not fatal
                self.invalid.append(repr(exc))
                message.ack()
                continue
            message.ack()
            for item in batch:
                try:
                    report = self._validate(item)
                except Exception as exc:
                    self.invalid.append(repr(exc))
                    continue
                report["_received"] = time.time()
                self.reports.append(report)
                self.record.write(json.dumps(report) + "\n")
                self.record.flush()

    def _next(self) -> Any:
        """The next message of either queue, or None."""
        for queue in self.queues:
            try:
                return queue.get_nowait()
            except queue.Empty:
                continue
        return None

    def of(self, kind: str, job_id: int | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.reports
            if r["type"] == kind and (job_id is None or r.get("job_id") == job_id)
        ]

    def first(self, kind: str, job_id: int | None = None) -> dict[str, Any] | None:
        found = self.of(kind, job_id)
        return found[0] if found else None

    def log_chunks(self, job_id: int) -> list[tuple[int, str]]:
        """(offset, data) of a job's log reports, one per offset (delivery is at least
        once), in offset order."""
        chunks = {r["offset"]: r["data"] for r in self.of("log", job_id)}
        return sorted(chunks.items())

    def log_text(self, job_id: int) -> str:
        return "".join(data for _, data in self.log_chunks(job_id))

    def close(self) -> None:
        try:
            for queue in self.queues:
                queue.close()
            self.connection.release()
        finally:
            self.record.close()


def tagged(text: str, tag: str) -> Any:
    """The JSON after ``TAG `` on a line of a job's output, or None."""
    match = re.search(rf"^{tag} (.*)$", text, re.MULTILINE)
    if not match:
        return None
    try:
        return json.loads(match.group(1))
    except ValueError:
        return None


def marker(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} ([0-9.]+)", text, re.MULTILINE)
    return float(match.group(1)) if match else None


# --- setup ------------------------------------------------------------------------------------


def other_x(path: Path) -> bool:
    """Others may execute / search ``path``."""
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def traversable(path: Path) -> bool:
    """Every directory from ``/`` to ``path`` (itself included) is o+x."""
    return all(other_x(d) for d in [path, *path.parents])


def job_python() -> tuple[str, str]:
    """A Python job accounts can execute (the check's own, if every component of its path,
    links resolved, is o+x; else /usr/bin/python3), and why that one."""
    own = Path(sys.executable)
    real = Path(os.path.realpath(own))
    if traversable(real) and traversable(own.parent):
        return str(own), f"the check's own interpreter ({real} is reachable by job accounts)"
    chain = [*reversed(real.parents), real, *reversed(own.parents)]
    blocked = next((d for d in chain if not other_x(d)), real)
    return "/usr/bin/python3", f"{own} -> {real} is not reachable ({blocked} not o+x)"


def probe_torch(python: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether ``python`` finds torch when another user (nobody) runs it, and its version."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return {"torch": None, "why": "not probed (no user nobody)"}
    code = (
        "import importlib.util as u, json, sys; "
        "print(json.dumps({'torch': u.find_spec('torch') is not None, "
        "'version': '%d.%d' % sys.version_info[:2]}))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code],
            user=nobody,
            group=nobody,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return json.loads(out.stdout)
    except Exception as exc:
        return {"torch": None, "why": f"probe failed: {exc!r}"}


def torch_site_dir() -> str | None:
    """The folder holding this interpreter's torch package (not imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(list(spec.submodule_search_locations)[0]).parent)


def nvml_gpu_count() -> tuple[int, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount(), "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        return 0, f"NVML unavailable: {exc!r}"


def base_dir() -> Path:
    """A 0711 folder job accounts can pass through (every parent o+x)."""
    parent = Path("/var/tmp") if traversable(Path("/var/tmp")) else Path("/tmp")
    base = parent / f"sluice-isocheck-{os.getpid()}"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    return base


def nvidia_smi_apps() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-compute-apps=pid,used_memory,name",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return (out.stdout + out.stderr).strip()
    except Exception as exc:
        return f"nvidia-smi failed: {exc!r}"


# --- the run ------------------------------------------------------------------------------


class Run:
    """One agent, its broker, its reports and the checks."""

    def __init__(self, args: argparse.Namespace, real: bool, spec: str | None) -> None:
        from scheduling.agent.transport import broker_connection

        self.args = args
        self.real = real
        self.spec = spec
        self.mode = "real" if real else "simulated"
        self.deadline = time.monotonic() + args.deadline
        self.checks = Checks()
        self.summary: dict[str, Any] = {
            "mode": self.mode if real else f"simulated {spec}",
            "python": sys.executable,
            "python_version": sys.version.split()[0],
            "accounts_left": [ACCOUNT_A, ACCOUNT_B],
            "known_gaps": [],
            "useradd": shutil.which("useradd", path="/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        self.python, why = job_python()
        self.summary["job_python"] = {"path": self.python, "why": why}
        log(f"job python: {self.python} ({why})")
        #: Added to every job's environment (PYTHONPATH when jobs need it for torch).
        self.job_env: dict[str, str] = {}
        if real:
            self.find_torch_for_jobs()
        self.base = base_dir()
        self.broker_dir = self.base / "broker"
        self.broker_dir.mkdir(mode=0o700)
        self.work = self.base / "work"
        self.agent_log_path = self.base / "agent.log"
        self.secret = secrets.token_hex(16)
        self.collector = Collector(self.broker_dir, self.base / "reports.jsonl")
        self.connection = broker_connection("filesystem://", self.broker_dir)
        self.agent: subprocess.Popen | None = None
        self.agent_log = None
        self.uuids: dict[int, str] = {}
        self.isolation: dict[str, Any] = {}
        self.info_a: dict[str, Any] | None = None
        log(f"work dir {self.work}, broker {self.broker_dir}")

    def find_torch_for_jobs(self) -> None:
        """Check that job accounts find torch with the job python; where the fallback
        interpreter lacks it but is this one's version, lend it this one's packages."""
        probe = probe_torch(self.python)
        if probe.get("torch") is False and self.python != sys.executable:
            site = torch_site_dir()
            ours = "{}.{}".format(*sys.version_info[:2])
            if site and traversable(Path(site)) and probe.get("version") == ours:
                retry = probe_torch(self.python, {"PYTHONPATH": site})
                if retry.get("torch"):
                    self.job_env = {"PYTHONPATH": site}
                    probe = {**retry, "PYTHONPATH": site}
        self.summary["job_python"]["torch_for_job_accounts"] = probe
        log(f"job python as user nobody: {probe}")
        if not probe.get("torch"):
            log("WARNING: job accounts may not import torch: A and B will say so")

    # --- plumbing

    def start_agent(self) -> None:
        env = dict(os.environ)
        # Absolute: the agent runs in the work folder, not here.
        paths = [str(PACKAGE_ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
        for name in ("CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "SLUICE_BROKER_DIR"):
            env.pop(name, None)
        env[SECRET_NAME] = self.secret
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "scheduling.agent",
            "--node",
            NODE,
            "--pool",
            POOL,
            "--broker",
            "filesystem://",
            "--broker-dir",
            str(self.broker_dir),
            "--work-dir",
            str(self.work),
            "--create-accounts",
            "--heartbeat",
            "1",
        ]
        if self.spec:
            cmd += ["--simulate", self.spec]
        if self.args.cgroup_root:
            cmd += ["--cgroup-root", self.args.cgroup_root]
        self.agent_log = self.agent_log_path.open("w")
        self.agent = subprocess.Popen(
            cmd,
            env=env,
            cwd=self.base,
            stdout=self.agent_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.summary["agent_command"] = " ".join(cmd[1:])
        log(f"agent pid {self.agent.pid}: {' '.join(cmd[1:])}")

    def wait_for(self, predicate, timeout: float, what: str) -> Any:
        end = min(time.monotonic() + timeout, self.deadline)
        while True:
            value = predicate()
            if value:
                return value
            if self.agent is not None and self.agent.poll() is not None:
                raise Timeout(f"the agent exited ({self.agent.returncode}) waiting for {what}")
            if time.monotonic() >= end:
                raise Timeout(f"timed out waiting for {what}")
            self.collector.pump(0.2)

    def wait_exited(self, job_id: int, timeout: float) -> dict[str, Any]:
        return self.wait_for(
            lambda: self.collector.first("exited", job_id), timeout, f"job {job_id} exited"
        )

    def wait_tag(self, job_id: int, tag: str, timeout: float) -> Any:
        """The job's ``TAG {json}`` line; Timeout (with the job's end) if it ended first."""

        def found():
            value = tagged(self.collector.log_text(job_id), tag)
            if value is not None:
                return value
            exited = self.collector.first("exited", job_id)
            if exited and exited["_received"] + 3 < time.time():  # its last log is in
                raise Timeout(
                    f"job {job_id} ended without {tag}: {exited['message']}; "
                    f"log: {self.collector.log_text(job_id)[-600:]!r}"
                )
            return None

        return self.wait_for(found, timeout, f"{tag} of job {job_id}")

    def launch(self, job_id: int, name: str, program: str, argv: list[str], **fields) -> None:
        from scheduling.agent.protocol import launch_message
        from scheduling.agent.transport import send_control_message

        fields.setdefault("gpu_indices", [])
        fields.setdefault("gpu_uuids", [self.uuids[i] for i in fields["gpu_indices"]])
        fields.setdefault("grace_seconds", STOP_GRACE)
        fields["env"] = {**self.job_env, **fields.get("env", {})}
        message = launch_message(
            job_id=job_id,
            attempt=1,
            name=name,
            command=[self.python, "-c", program, *argv],
            **fields,
        )
        send_control_message(self.connection, NODE, message)
        log(f"launched job {job_id} ({name}) as {fields.get('run_as')}")

    def stop(self, job_id: int) -> None:
        from scheduling.agent.protocol import stop_message
        from scheduling.agent.transport import send_control_message

        message = stop_message(
            job_id=job_id, attempt=1, reason="cancelled", grace_seconds=STOP_GRACE
        )
        send_control_message(self.connection, NODE, message)

    def work_dir_real(self) -> Path:
        return Path(os.path.realpath(self.work))

    def job_dir(self, job_id: int) -> Path:
        return self.work_dir_real() / "jobs" / f"{job_id}-1"

    # --- teardown

    def teardown(self) -> None:
        from scheduling.agent import procfs

        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        try:  # what the agent delivered on its way out (started reports: groups to kill)
            self.collector.pump(1.0)
        except Exception as exc:
            log(f"last pump failed: {exc!r}")
        if self.agent is not None:
            self.summary["agent_returncode"] = self.agent.returncode
        if self.agent_log is not None:
            self.agent_log.close()
        # Jobs outlive their agent (the next one adopts them): kill what is left of ours.
        killed = []
        for started in self.collector.of("started"):
            group = started["pid"]
            members = [m for m in procfs.group_members(group) if m.session == group]
            if members:
                try:
                    os.killpg(group, signal.SIGKILL)
                    killed.append(group)
                except OSError:
                    pass
        if killed:
            log(f"killed leftover job process groups {killed}")
            time.sleep(0.5)
        self.summary["leftover_groups_killed"] = killed
        for started in self.collector.of("started"):
            cgroup = (started.get("isolation") or {}).get("cgroup")
            if cgroup and Path(cgroup).is_dir():
                try:
                    (Path(cgroup) / "cgroup.kill").write_text("1")
                    Path(cgroup).rmdir()
                except OSError as exc:
                    log(f"cannot remove cgroup {cgroup}: {exc}")
        self.connection.release()
        self.collector.close()


# --- the checks -----------------------------------------------------------------------------


def check_register(run: Run) -> None:
    """1. backend and the isolation report."""
    register = run.wait_for(lambda: run.collector.first("register"), 60, "register")
    run.wait_for(lambda: run.collector.first("heartbeat"), 30, "first heartbeat")
    run.uuids = {g["index"]: g["uuid"] for g in register["gpus"]}
    run.isolation = register.get("isolation") or {}
    expected = "nvml" if run.real else "simulated"
    print("register isolation (verbatim):")
    print(json.dumps(run.isolation, indent=1))
    run.summary["register"] = {
        k: register.get(k) for k in ("backend", "gpus", "hostname", "cpus", "memory_mb")
    }
    run.summary["isolation"] = run.isolation
    ok = register["backend"] == expected and run.isolation.get("run_as_user") is True
    run.checks.add(
        "1 register: backend and isolation (run_as_user)",
        ok,
        {
            "backend": register["backend"],
            "expected_backend": expected,
            "gpus": [(g["index"], g["name"], g["uuid"]) for g in register["gpus"]],
            "isolation": run.isolation,
        },
    )
    if not run.isolation.get("device_isolation"):
        run.summary["known_gaps"].append("register: device_isolation false")
    if not run.isolation.get("proc_hidden"):
        run.summary["known_gaps"].append("register: proc_hidden false (jobs list all processes)")


def launch_a(run: Run) -> None:
    run.launch(
        JOB_A,
        "iso-a",
        PROG_A,
        [str(run.args.a_seconds), run.mode],
        gpu_indices=[0],
        tenant="nlp",
        run_as=ACCOUNT_A,
        env={
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "LD_PRELOAD": "/tmp/x.so",
            "ISOCHECK_A_SECRET": "secret-of-a-" + secrets.token_hex(4),
        },
    )


def launch_side_jobs(run: Run) -> None:
    """D (log cap) always; C (cgroup limits) where the node has cgroups."""
    run.launch(
        JOB_D,
        "iso-d",
        PROG_D,
        [],
        tenant="vision",
        run_as=ACCOUNT_B,
        log_cap_bytes=LOG_CAP,
    )
    if run.isolation.get("cgroup"):
        for job_id, name, program in (
            (JOB_C_MEM, "iso-c-mem", PROG_C_MEM),
            (JOB_C_PIDS, "iso-c-pids", PROG_C_PIDS),
            (JOB_C_CPU, "iso-c-cpu", PROG_C_CPU),
        ):
            run.launch(job_id, name, program, [], tenant="vision", run_as=ACCOUNT_B, limits=LIMITS)


def check_job_a(run: Run) -> None:
    """2. A's identity, environment, GPU and started report."""
    info = run.wait_tag(JOB_A, "INFO", 120)
    run.info_a = info
    started = run.collector.first("started", JOB_A) or {}
    iso = started.get("isolation") or {}
    log(f"A: {json.dumps(info)}")
    try:
        uid_a = pwd.getpwnam(ACCOUNT_A).pw_uid
    except KeyError:
        uid_a = None
    run.checks.add(
        "2a A runs as sluice-iso-a (uid != 0)",
        info["user"] == ACCOUNT_A and info["uid"] != 0 and info["uid"] == uid_a,
        {"user": info["user"], "uid": info["uid"], "account_uid": uid_a, "cwd": info["cwd"]},
    )
    run.checks.add(
        "2b A: CUDA_VISIBLE_DEVICES == '0' (message asked 0,1,2,3)",
        info["CUDA_VISIBLE_DEVICES"] == "0",
        {k: info[k] for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")},
    )
    run.checks.add(
        "2c A: LD_PRELOAD dropped",
        info["LD_PRELOAD_present"] is False,
        {"LD_PRELOAD_present": info["LD_PRELOAD_present"]},
    )
    detail = {
        k: info.get(k)
        for k in ("device_count", "visible_count", "cuda_available", "torch", "torch_error")
    }
    if run.real:
        run.checks.add(CHECK_2D, info.get("device_count") == 1, detail)
        wanted = run.uuids.get(0, "")
        got = info.get("device_uuid")
        if got is None:
            run.checks.add("2e A's device is GPU 0 (UUID)", "SKIP", {"why": "torch gives no uuid"})
        else:
            same = got.lower().removeprefix("gpu-") == wanted.lower().removeprefix("gpu-")
            run.checks.add(
                "2e A's device is GPU 0 (UUID)",
                same,
                {"torch_uuid": got, "gpu0_uuid": wanted, "name": info.get("device_name")},
            )
    else:
        run.checks.add(CHECK_2D, info["visible_count"] == 1, {"simulated": True, **detail})
        run.checks.add("2e A's device is GPU 0 (UUID)", "SKIP", {"why": "simulated GPUs"})
    problems = []
    if iso.get("run_as") != ACCOUNT_A:
        problems.append(f"run_as {iso.get('run_as')!r}")
    if iso.get("uid") != info["uid"]:
        problems.append(f"uid {iso.get('uid')} vs the job's {info['uid']}")
    if "cgroup" not in iso or "limits" not in iso:
        problems.append("no cgroup/limits fields")
    elif bool(iso["cgroup"]) != bool(run.isolation.get("cgroup")):
        problems.append(
            f"cgroup {iso['cgroup']!r} while register says {run.isolation.get('cgroup')}"
        )
    run.checks.add(
        "2f A's started report carries isolation {run_as, uid, cgroup, limits}",
        not problems,
        {"isolation": iso, "problems": problems},
    )


def launch_b(run: Run) -> None:
    info = run.info_a or {}
    started = run.collector.first("started", JOB_A) or {}
    run.launch(
        JOB_B,
        "iso-b",
        PROG_B,
        [run.mode],
        gpu_indices=[],
        tenant="vision",
        run_as=ACCOUNT_B,
        env={
            "CUDA_VISIBLE_DEVICES": "0",
            "A_DIR": str(run.job_dir(JOB_A)),
            "JOBS_DIR": str(run.work_dir_real() / "jobs"),
            "A_PID": str(info.get("pid", 0)),
            "A_GROUP": str(started.get("pid", 0)),
            "AGENT_PID": str(run.agent.pid if run.agent else 0),
        },
    )


def a_state(run: Run) -> str | None:
    from scheduling.agent import procfs

    pid = (run.info_a or {}).get("pid")
    found = procfs.read_stat(pid) if pid else None
    return found.state if found else None


def check_job_b(run: Run) -> None:
    """4. B sees no GPU; its attacks on A and the agent are refused; A runs on."""
    results = run.wait_tag(JOB_B, "RESULTS", 120)
    exited = run.wait_exited(JOB_B, 20)
    text = run.collector.log_text(JOB_B)
    attempts = results.get("attempts", {})
    log(f"B: {json.dumps({k: v for k, v in results.items() if k != 'env_names'})}")
    cvd, nvd = results.get("CUDA_VISIBLE_DEVICES"), results.get("NVIDIA_VISIBLE_DEVICES")
    no_gpu = cvd == "" and nvd == "none"
    if run.real:
        no_gpu = no_gpu and results.get("device_count") == 0
        no_gpu = no_gpu and results.get("cuda_available") is False
    run.checks.add(
        "4a B (no GPU) sees no device",
        no_gpu,
        {
            "CUDA_VISIBLE_DEVICES": cvd,
            "NVIDIA_VISIBLE_DEVICES": nvd,
            **{k: results.get(k) for k in ("cuda_available", "device_count", "torch_error")},
        },
    )
    leaked = SECRET_NAME in results.get("env_names", []) or run.secret in text
    allowed = {name: o for name, o in attempts.items() if o not in DENIED}
    run.checks.add(
        "4b B's attempts on A and the agent refused (EACCES/EPERM)",
        bool(attempts) and not allowed and not leaked and exited["exit_code"] == 0,
        {
            "attempts": attempts,
            "not_refused": allowed,
            "agent_secret_seen_by_B": leaked,
            "own_workspace": results.get("own workspace"),
            "B_exit": exited["message"],
        },
    )
    state = a_state(run)
    if state in ("T", "t"):  # B stopped A: let it go on, the check has failed anyway
        os.kill(run.info_a["pid"], signal.SIGCONT)
    a_exited = run.collector.first("exited", JOB_A)
    run.checks.add(
        "4c A still running after B",
        state is not None and state not in ("T", "t", "Z", "X") and a_exited is None,
        {"A_state": state, "A_exited": a_exited and a_exited["message"]},
    )
    device = results.get("open /dev/nvidia0")
    run.summary["dev_nvidia0_opened_by_B"] = device
    run.checks.add("4d INFO B opens /dev/nvidia0 directly", "INFO", {"outcome": device})
    if device and device.startswith("opened"):
        run.summary["known_gaps"].append(
            "a job without GPUs can open /dev/nvidia0 (no device isolation)"
        )
    reset = results.get("reset CUDA_VISIBLE_DEVICES=0")
    if reset is not None:
        run.summary["b_reset_cvd"] = reset
        words = reset.get("stdout", "").split()  # "<device_count> <pid>"
        used = reset.get("rc") == 0 and words[:1] == ["1"]
        gpu_pid = int(words[1]) if used and len(words) > 1 and words[1].isdigit() else None
        beats = run.collector.of("heartbeat")
        on_gpu = any(p["pid"] == gpu_pid for b in beats for g in b["gpus"] for p in g["processes"])
        zombie = any(z["pid"] == gpu_pid for b in beats for z in b["zombies"])
        # Without device isolation this cannot be prevented, only seen: the agent reports
        # a job's process on a GPU it was not given as a zombie (then killable).
        run.checks.add(
            "4e B (no GPU) resetting CUDA_VISIBLE_DEVICES=0 and using GPU 0 is reported",
            zombie if used and on_gpu else "INFO",
            {**reset, "pid_seen_on_gpu": on_gpu, "reported_as_zombie": zombie},
        )
        if used:
            run.summary["known_gaps"].append(
                "a job without GPUs used GPU 0 by setting CUDA_VISIBLE_DEVICES itself"
                + ("; reported as a zombie" if zombie else "; the agent did not flag it")
            )


def check_heartbeat(run: Run) -> None:
    """3. GPU 0 busy while A computes; A's process on GPU 0, never a zombie."""
    text = run.wait_for(
        lambda: marker(run.collector.log_text(JOB_A), "LOOP_END") and run.collector.log_text(JOB_A),
        run.args.a_seconds + 60,
        "A's LOOP_END",
    )
    start, end = marker(text, "LOOP_START"), marker(text, "LOOP_END")
    run.summary["a_loop"] = {"start": start, "end": end, "seconds": round(end - start, 1)}
    beats = [b for b in run.collector.of("heartbeat") if start + 1.5 <= b["sent_at"] <= end - 0.5]
    samples = [
        (round(b["sent_at"] - start, 1), g["utilization"], g["memory_used_mb"])
        for b in beats
        for g in b["gpus"]
        if g["index"] == 0
    ]
    values = [s[1] for s in samples if s[1] is not None]
    median = statistics.median(values) if values else None
    detail = {"median": median, "n": len(values), "samples(t,util,mem_mb)": samples}
    pid = (run.info_a or {}).get("pid")
    listed = sorted(
        {p["pid"] for b in beats for g in b["gpus"] if g["index"] == 0 for p in g["processes"]}
    )
    zombies = sorted({z["pid"] for b in run.collector.of("heartbeat") for z in b["zombies"]})
    if not run.real:
        run.checks.add(
            "3a GPU 0 utilization > 50 % while A computes",
            "SKIP",
            {"why": "simulated GPUs", **detail},
        )
        run.checks.add(
            "3b A's process on GPU 0, not a zombie",
            "SKIP",
            {"why": "simulated GPUs", "A_pid": pid, "listed": listed},
        )
        return
    run.checks.add(
        "3a GPU 0 utilization > 50 % while A computes",
        len(values) >= 3 and median is not None and median > 50,
        detail,
    )
    run.checks.add(
        "3b A's process on GPU 0, not a zombie",
        pid in listed and pid not in zombies,
        {
            "A_pid": pid,
            "listed_on_gpu0": listed,
            "zombie_pids": zombies,
            "nvidia_smi_apps": run.summary.get("nvidia_smi_apps"),
        },
    )


def check_cgroup(run: Run) -> None:
    """5. memory, pids and cpu limits of the C jobs (each where its controller is on)."""
    if not run.isolation.get("cgroup"):
        note = next((n for n in run.isolation.get("notes", []) if "cgroup" in n), "cgroup false")
        for name in CHECK_5:
            run.checks.add(name, "SKIP", {"agent_note": note})
        return
    controllers = run.isolation.get("cgroup_controllers", [])
    figures = run.summary.setdefault("cgroup_figures", {})
    for controller, job_id, name, judge in (
        ("memory", JOB_C_MEM, CHECK_5[0], judge_memory),
        ("pids", JOB_C_PIDS, CHECK_5[1], judge_pids),
        ("cpu", JOB_C_CPU, CHECK_5[2], judge_cpu),
    ):
        if controller not in controllers:
            run.checks.add(
                name,
                "SKIP",
                {"why": f"no {controller} controller", "notes": run.isolation.get("notes")},
            )
            continue
        try:
            exited = run.wait_exited(job_id, 60)
        except Timeout as exc:
            run.checks.add(name, False, {"why": str(exc)})
            continue
        ok, detail = judge(exited, run.collector.log_text(job_id))
        figures[controller] = detail
        run.checks.add(name, ok, detail)
    expected = {
        key: value
        for key, value, controller in (
            ("cpus", LIMITS["cpus"], "cpu"),
            ("memory_mb", LIMITS["memory_mb"], "memory"),
            ("pids", LIMITS["pids"], "pids"),
        )
        if controller in controllers
    }
    problems = {}
    for job_id in (JOB_C_MEM, JOB_C_PIDS, JOB_C_CPU):
        iso = (run.collector.first("started", job_id) or {}).get("isolation") or {}
        if iso.get("limits") != expected or not iso.get("cgroup"):
            problems[job_id] = iso
    run.checks.add(CHECK_5[3], not problems, {"expected": expected, "problems": problems})


def judge_memory(exited: dict[str, Any], text: str) -> tuple[bool, dict[str, Any]]:
    """Killed (SIGKILL, the OOM killer) before it held 1 GiB."""
    allocated = re.findall(r"^allocated (\d+) MiB", text, re.MULTILINE)
    detail = {
        "exit": exited["message"],
        "signal": exited["signal"],
        "allocated_before_kill_mib": int(allocated[-1]) if allocated else 0,
    }
    return exited["signal"] == signal.SIGKILL and "MEM_SURVIVED" not in text, detail


def judge_pids(exited: dict[str, Any], text: str) -> tuple[bool, dict[str, Any]]:
    """Starting processes failed with EAGAIN before the pids limit."""
    pids = tagged(text, "PIDS") or {}
    ok = pids.get("error") == "EAGAIN" and 0 < pids.get("started", 0) < LIMITS["pids"]
    return ok, {**pids, "exit": exited["message"], "log_tail": text[-300:]}


def judge_cpu(exited: dict[str, Any], text: str) -> tuple[bool, dict[str, Any]]:
    """At most ~0.6 CPU-second per second; where the job could read its cgroup's cpu.stat,
    throttled too (on a busy machine a low share alone proves nothing)."""
    cpu = tagged(text, "CPU") or {}
    throttled = int((cpu.get("cpu.stat") or {}).get("nr_throttled", 1))
    ok = 0 < cpu.get("cpu_per_s", 9) <= 0.6 and throttled > 0
    return ok, {**cpu, "exit": exited["message"]}


def check_stop(run: Run) -> None:
    """6. stop A: exited within grace + 3 s, its process group gone."""
    from scheduling.agent import procfs

    group = (run.collector.first("started", JOB_A) or {}).get("pid")
    if run.collector.first("exited", JOB_A):
        run.checks.add(
            "6 stop A: exited within grace, group gone", False, {"why": "A ended before the stop"}
        )
        return
    sent = time.time()
    run.stop(JOB_A)
    log(f"sent stop (cancelled, grace {STOP_GRACE} s) to A")
    exited = run.wait_exited(JOB_A, STOP_GRACE + 15)
    took = exited["finished_at"] - sent
    time.sleep(0.3)
    left = [(m.pid, m.comm) for m in procfs.group_members(group)] if group else ["no group"]
    run.checks.add(
        "6 stop A: exited within grace, group gone",
        exited["stop_reason"] == "cancelled" and took <= STOP_GRACE + 3 and not left,
        {
            "stop_to_exit_s": round(took, 2),
            "grace_s": STOP_GRACE,
            **{k: exited[k] for k in ("exit_code", "signal", "stop_reason", "message")},
            "group": group,
            "group_left": left,
            "A_said": re.findall(r"^A_SIGTERM.*$", run.collector.log_text(JOB_A), re.MULTILINE),
        },
    )


def check_log_cap(run: Run) -> None:
    """7. D's log stops at the cap with the marker; D exits 0."""
    from scheduling.agent.protocol import log_truncated_marker

    exited = run.wait_exited(JOB_D, 60)
    run.collector.pump(1.0)
    chunks = run.collector.log_chunks(JOB_D)
    expected_marker = log_truncated_marker(LOG_CAP)
    before = [(o, d) for o, d in chunks if o < LOG_CAP]
    contiguous, position = True, 0
    for offset, data in before:
        contiguous = contiguous and offset == position
        position = offset + len(data.encode())
    at_cap = [d for o, d in chunks if o == LOG_CAP]
    beyond = [o for o, _ in chunks if o > LOG_CAP]
    ok = (
        contiguous
        and position == LOG_CAP
        and at_cap == [expected_marker]
        and not beyond
        and exited["exit_code"] == 0
        and exited["signal"] is None
    )
    run.checks.add(
        "7 log cap: D's log stops at 65536 bytes with the marker, D exits 0",
        ok,
        {
            "shipped_bytes_before_cap": position,
            "contiguous": contiguous,
            "chunk_offsets": [o for o, _ in chunks],
            "marker": at_cap,
            "expected_marker": expected_marker,
            "beyond_cap": beyond,
            "D_exit": exited["message"],
        },
    )


def check_agent_log(run: Run) -> None:
    """8. no traceback (nor ERROR/CRITICAL) in the agent's log."""
    text = run.agent_log_path.read_text() if run.agent_log_path.exists() else ""
    lines = text.splitlines()
    bad = [x for x in lines if re.search(r"Traceback| ERROR | CRITICAL ", x)]
    warnings = [x for x in lines if " WARNING " in x]
    run.summary["agent_warnings"] = warnings[:30]
    if bad or run.summary.get("agent_returncode"):
        run.summary["agent_log_tail"] = text[-3000:]
    run.checks.add(
        "8 agent log free of tracebacks",
        not bad and not run.collector.invalid,
        {
            "bad_lines": bad[:20],
            "invalid_reports": run.collector.invalid[:5],
            "warnings": len(warnings),
            "agent_returncode": run.summary.get("agent_returncode"),
        },
    )


ALL_CHECKS = (
    "1 register: backend and isolation (run_as_user)",
    "2a A runs as sluice-iso-a (uid != 0)",
    "2b A: CUDA_VISIBLE_DEVICES == '0' (message asked 0,1,2,3)",
    "2c A: LD_PRELOAD dropped",
    CHECK_2D,
    "2f A's started report carries isolation {run_as, uid, cgroup, limits}",
    "3a GPU 0 utilization > 50 % while A computes",
    "3b A's process on GPU 0, not a zombie",
    "4a B (no GPU) sees no device",
    "4b B's attempts on A and the agent refused (EACCES/EPERM)",
    "4c A still running after B",
    *CHECK_5,
    "6 stop A: exited within grace, group gone",
    "7 log cap: D's log stops at 65536 bytes with the marker, D exits 0",
)


def run_checks(run: Run) -> None:
    """The sequence; each step raises Timeout when what it waits for does not come."""
    steps_failed: list[str] = []

    def step(name: str, function, *args) -> None:
        try:
            function(*args)
        except Timeout as exc:
            log(f"{name}: {exc}")
            steps_failed.append(f"{name}: {exc}")
        except Exception as exc:  # a bug here: report it and go on with the rest
            log(f"{name}: {exc!r}")
            traceback.print_exc()
            steps_failed.append(f"{name}: {exc!r}")

    run.start_agent()
    step("register", check_register, run)
    if not run.collector.first("register"):
        run.summary["problems"] = steps_failed
        return
    step("launch A", launch_a, run)
    step("launch C/D", launch_side_jobs, run)
    step("job A", check_job_a, run)
    if run.info_a is not None:
        step("launch B", launch_b, run)
        if run.real:
            time.sleep(3)  # A computes by now
            run.summary["nvidia_smi_apps"] = nvidia_smi_apps()
        step("job B", check_job_b, run)
    step("cgroup", check_cgroup, run)
    step("log cap", check_log_cap, run)
    if run.info_a is not None:
        step("heartbeat", check_heartbeat, run)
        step("stop", check_stop, run)
    run.summary["problems"] = steps_failed


def finish(run: Run | None, checks: Checks, summary: dict[str, Any], out: str | None) -> int:
    for name in ALL_CHECKS:
        if not checks.has(name):
            checks.add(name, False, {"why": "not reached", "problems": summary.get("problems")})
    summary["checks"] = checks.items
    summary["passed"], summary["failed"] = checks.count("PASS"), checks.count("FAIL")
    summary["skipped"], summary["info"] = checks.count("SKIP"), checks.count("INFO")
    if run is not None:
        summary["reports"] = {
            k: len(run.collector.of(k))
            for k in ("register", "heartbeat", "started", "log", "exited")
        }
    if out:
        dest = Path(out)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "isolation_summary.json").write_text(json.dumps(summary, indent=1, default=str))
        if run is not None:
            for name in ("agent.log", "reports.jsonl"):
                if (run.base / name).exists():
                    shutil.copy(run.base / name, dest / name)
        for name in ("isolation_summary.json", "agent.log", "reports.jsonl"):
            if (dest / name).exists():
                (dest / name).chmod(0o644)  # written under umask 077, meant to be read
    print("\n=== checks ===")
    for item in sorted(checks.items, key=lambda item: item["check"]):
        print(f"{item['status']:4}  {item['check']}")
    print("\n=== summary (JSON) ===")
    short = {k: v for k, v in summary.items() if k not in ("checks", "agent_warnings")}
    short["checks"] = {
        i["check"]: i["status"] for i in sorted(checks.items, key=lambda i: i["check"])
    }
    print(json.dumps(short, indent=1, default=str))
    print(
        f"\nRESULT: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped, {summary['info']} info ({summary.get('mode')}); "
        f"accounts {ACCOUNT_A}, {ACCOUNT_B} left in place"
    )
    return 1 if summary["failed"] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice-agent check-isolation",
        description="Start a node agent as root, run jobs of two tenants under it and check "
        "that they cannot reach each other (accounts, files, processes, GPUs, cgroup limits, "
        "log cap). Exit status: 0 all passed, 1 a check failed, 2 not run as root.",
    )
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        type=_simulation_spec,
        help=f"simulated GPUs, e.g. {SIM_SPEC} (default: NVML's, else {SIM_SPEC})",
    )
    parser.add_argument("--out", help="folder for isolation_summary.json, agent.log, reports")
    parser.add_argument(
        "--cgroup-root", metavar="DIR", help="the agent's --cgroup-root (default: its own)"
    )
    parser.add_argument(
        "--a-seconds",
        type=_positive,
        default=15.0,
        metavar="SECONDS",
        help="how long job A computes (default: %(default)g)",
    )
    parser.add_argument(
        "--deadline",
        type=_positive,
        default=150.0,
        metavar="SECONDS",
        help="give up after (default: %(default)g)",
    )
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def _simulation_spec(text: str) -> str:
    from scheduling.agent.gpus import parse_simulation_spec

    try:
        parse_simulation_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the check (``argv``: its arguments, without ``check-isolation``); returns the
    exit status."""
    args = build_parser().parse_args(argv)
    if os.geteuid() != 0:
        print("run as root: jobs switch to their own accounts only under a root agent")
        return 2
    # Our files (agent log, reports with the jobs' output) sit in a folder job accounts
    # pass through: only root reads them.
    os.umask(0o077)
    t0 = time.monotonic()
    spec = args.simulate
    real = False
    if not spec:
        count, why = nvml_gpu_count()
        real = count > 0
        if not real:
            spec = SIM_SPEC
            log(f"no NVML GPU ({why}): simulated mode ({spec}), CPU busy loop instead of torch")
    log(f"mode: {'real (NVML)' if real else 'simulated ' + spec}")
    run = Run(args, real, spec)
    try:
        run_checks(run)
    finally:
        try:
            run.teardown()
        except Exception:  # still report what was seen
            traceback.print_exc()
        check_agent_log(run)
        run.summary["elapsed_s"] = round(time.monotonic() - t0, 1)
        code = finish(run, run.checks, run.summary, args.out)
        shutil.rmtree(run.base, ignore_errors=True)
        log(f"removed {run.base}")
    return code


if __name__ == "__main__":
    sys.exit(main())
