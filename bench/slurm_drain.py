"""A Slurm pool against Slurm itself, in the same run.

    sudo .venv/bin/python bench/slurm_drain.py [--jobs 1000] [--rounds 1] [--idle 10] [--keep]
    sudo .venv/bin/python bench/slurm_drain.py --jobs 320 --runtime 30 --idle 3 --seq 0

Starts an emulated Slurm cluster of 4 nodes × 8 fake GPUs (tools/slurm_cluster.py) and, on
PostgreSQL + Redis, Sluice as ``bench/e2e.py`` does (gunicorn, the ``dispatcher`` worker, the
``worker`` with beat) but with the Slurm bridge (``python -m scheduling.executors.slurm``)
serving the partition instead of agents. Then, in alternating rounds:

* ``slurm``: N one-GPU jobs running ``true`` (``sleep`` for ``--runtime`` seconds) submitted straight to the partition with plain
  ``sbatch`` (8 submitting threads, the jobs as ``nobody`` like Sluice's), timed from the
  first submission until the controller lists them all as ended (polled every 0.2 s);
* ``sluice``: the same N jobs as one ``POST /api/v1/jobs/bulk``, dispatched by Sluice, sent
  to the bridge and submitted by it to the same partition, pinned to the node Sluice chose;
  timed until the API shows them all ended.

And, one after another on the idle cluster, ``--idle`` jobs (``sleep 1``) of each kind:
submit → RUNNING (Slurm: ``sbatch`` then ``squeue`` polled every ~20 ms; Sluice: ``POST``
then ``GET`` polled every ~20 ms), median of each.

And ``--seq`` submissions in a row from one client (a ``true`` job each): ``sbatch`` one
after another, then ``POST /api/v1/jobs/`` one after another (the API's own client, a kept
connection, as a script or the CLI would use it); submissions/s of each and their ratio
(target ≥ 1: accepting a job costs no more than ``sbatch``), and the CPU per submission
each process on the machine spent meanwhile (``slurm_cpu_ms``, ``sluice_cpu_ms``: the
Sluice processes, the Slurm daemons, munge, PostgreSQL, Redis, this client and everything
else), read from /proc.

Prints one JSON line per figure and a summary: both drain rates, their ratio (target
≥ 0.9), both idle medians and their difference (target ≤ 0.5 s), and the load average
beside each. Needs root (slurmd runs jobs as their users), Slurm, munge, PostgreSQL and
Redis. Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tools"))
import e2e  # noqa: E402
import slurm_cluster  # noqa: E402

PARTITION = "sluice"
SUBMIT_THREADS = 8
POLL_SECONDS = 0.2
IDLE_POLL_SECONDS = 0.02
RATIO_TARGET = 0.9
IDLE_GAP_TARGET = 0.5
SLURM_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def log(message: str) -> None:
    print(f"[slurm-drain {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load() -> float:
    return os.getloadavg()[0]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


#: Processes counted by their name: the Slurm daemons, and the servers Sluice shares with
#: whatever else runs on the machine (all their processes, whoever they serve).
_SHARED = {
    name: name
    for name in ("slurmctld", "slurmd", "slurmstepd", "munged", "postgres", "redis-server")
}


def cpu_by_process(sessions: dict[int, str]) -> dict[str, float]:
    """CPU seconds used so far by every process, summed per Sluice process (the session it
    started, children included: gunicorn's workers, Celery's pool), per Slurm daemon and
    shared server (``_SHARED``), for this script (``client``, with the ``sbatch`` processes
    it ran and reaped) and for everything else (``other``)."""
    totals: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        fields = rest.split()
        # After the name: state, ppid, pgrp, session, ... utime (12th), stime (13th).
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        name = sessions.get(int(fields[3])) or _SHARED.get(comm) or "other"
        if int(entry) == os.getpid():  # with the sbatch processes it ran (reaped)
            name = "client"
            seconds += (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        totals[name] = totals.get(name, 0.0) + seconds
    return totals


def cpu_spent(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """Milliseconds of CPU per submission, per process, between two ``cpu_by_process``
    (a process that ended meanwhile is not counted)."""
    return {
        name: round((after[name] - before.get(name, 0.0)) * 1000 / count, 1)
        for name in sorted(after)
        if after[name] - before.get(name, 0.0) > 0
    }


class SluiceOnSlurm(e2e.Cluster):
    """Sluice's processes as in bench/e2e.py, with the Slurm bridge instead of agents."""

    def __init__(self, backend: e2e.Backend, tmp: Path, slurm: dict, refresh: float) -> None:
        super().__init__(backend, tmp)
        self.slurm = slurm
        self.refresh = refresh
        self.env["SLURM_CONF"] = slurm["slurm_conf"]
        self.work = tmp / "slurm-work"
        self.work.mkdir(mode=0o755)
        self.work.chmod(0o755)

    def start(self) -> None:
        py = sys.executable
        self.start_control_plane()  # the bridge serves the nodes instead of agents
        self._spawn(
            "bridge",
            [
                py,
                "-m",
                "scheduling.executors.slurm",
                "--pool",
                e2e.POOL,
                "--partition",
                PARTITION,
                "--work-dir",
                str(self.work),
                "--broker",
                self.env["CELERY_BROKER_URL"],
                "--refresh",
                str(self.refresh),
            ],
        )

    def _kill_jobs(self) -> None:
        """Slurm's jobs end with the emulated cluster (its stop cancels them)."""


class SlurmSide:
    """Jobs submitted straight to the partition, and what the controller says of them."""

    def __init__(self, conf: str, out_dir: Path) -> None:
        self.env = {**os.environ, "SLURM_CONF": conf}
        self.out_dir = out_dir
        out_dir.mkdir(mode=0o777, exist_ok=True)
        out_dir.chmod(0o777)

    def sbatch(self, name: str, command: str) -> str:
        result = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--partition={PARTITION}",
                f"--job-name={name}",
                "--gres=gpu:1",
                "--ntasks=1",
                "--no-requeue",
                "--uid=nobody",
                "--gid=nogroup",
                f"--output={self.out_dir}/%j.out",
                f"--chdir={self.out_dir}",
                f"--wrap={command}",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip().split(";")[0]

    def states(self, name: str) -> dict[str, str]:
        result = subprocess.run(
            ["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i %T"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(line.split() for line in result.stdout.splitlines() if line.strip())

    def state(self, job_id: str) -> str:
        result = subprocess.run(
            ["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", "%T"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout.strip()


def job_command(runtime: float) -> list[str]:
    """What each drained job runs: ``true``, or ``sleep`` for ``--runtime`` seconds."""
    return ["sleep", f"{runtime:g}"] if runtime > 0 else ["true"]


def drain_timeout(jobs: int, runtime: float) -> float:
    """How long a drain may take: the fixed allowance, and the jobs' runtime spread over
    the cluster's GPUs twice over."""
    return 120 + jobs / 2 + 2 * jobs * runtime / (e2e.NODES * e2e.GPUS_PER_NODE)


def slurm_drain(side: SlurmSide, jobs: int, round_no: int, runtime: float = 0.0) -> dict:
    name = f"straight-{round_no}-{os.getpid()}"
    command = " ".join(job_command(runtime))
    todo = iter(range(jobs))
    lock = threading.Lock()
    errors: list[str] = []

    def submitter() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            try:
                side.sbatch(name, command)
            except subprocess.CalledProcessError as exc:
                errors.append(exc.stderr.strip())

    before = load()
    t0 = time.monotonic()
    threads = [threading.Thread(target=submitter, daemon=True) for _ in range(SUBMIT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    submitted = time.monotonic() - t0
    if errors:
        raise e2e.BenchError(f"sbatch failed {len(errors)} times: {errors[0]}")
    deadline = t0 + drain_timeout(jobs, runtime)
    while True:
        states = side.states(name)
        ended = sum(state in SLURM_ENDED for state in states.values())
        if ended >= jobs:
            break
        if time.monotonic() > deadline:
            raise e2e.BenchError(f"Slurm drained {ended}/{jobs} jobs within the time allowed")
        time.sleep(POLL_SECONDS)
    seconds = time.monotonic() - t0
    failed = sum(state != "COMPLETED" for state in states.values())
    return {
        "seconds": round(seconds, 2),
        "rate": round(jobs / seconds, 2),
        "submit_seconds": round(submitted, 2),
        "failed": failed,
        "load": round((before + load()) / 2, 2),
    }


def sluice_drain(bench: e2e.Bench, jobs: int, runtime: float = 0.0) -> dict:
    bench.wait_idle()
    specs = [e2e._spec(bench.world, "bulk", job_command(runtime))] * jobs
    bench.drain_timeout = drain_timeout(jobs, runtime)
    before_ended = bench.ended("bulk")
    before = load()
    t0 = time.monotonic()
    bench.api.post("jobs/bulk", {"jobs": specs})
    posted = time.monotonic() - t0
    drain = bench.wait_drained("bulk", before_ended + jobs, t0, jobs)
    if not drain.complete:
        raise e2e.BenchError(f"Sluice drained {drain.ended - before_ended}/{jobs} jobs in time")
    return {
        "seconds": round(drain.seconds, 2),
        "rate": round(jobs / drain.seconds, 2),
        "submit_seconds": round(posted, 2),
        "load": round((before + load()) / 2, 2),
    }


def sequential_submissions(bench: e2e.Bench, side: SlurmSide, count: int) -> dict:
    """``count`` submissions in a row from one client to each, timed over the submissions
    alone (the jobs then drain before the next phase)."""
    wait_slurm_idle(side)
    name = f"seq-{os.getpid()}"
    sessions = {proc.pid: process for process, proc in bench.cluster.procs.items()}
    cpu_before = cpu_by_process(sessions)
    t0 = time.monotonic()
    for _ in range(count):
        side.sbatch(name, "true")
    slurm_seconds = time.monotonic() - t0
    slurm_cpu = cpu_spent(cpu_before, cpu_by_process(sessions), count)
    wait_slurm_idle(side, timeout=120 + count)
    bench.wait_idle()
    spec = e2e._spec(bench.world, "seq", ["true"])
    before_ended = bench.ended("seq")
    before = load()
    cpu_before = cpu_by_process(sessions)
    t0 = time.monotonic()
    for _ in range(count):
        bench.api.post("jobs/", spec)
    sluice_seconds = time.monotonic() - t0
    sluice_cpu = cpu_spent(cpu_before, cpu_by_process(sessions), count)
    bench.wait_drained("seq", before_ended + count, t0, count)
    return {
        "slurm_per_s": round(count / slurm_seconds, 1),
        "sluice_per_s": round(count / sluice_seconds, 1),
        "jobs": count,
        # CPU milliseconds per submission while each side's submissions ran, by process
        # ("other": the rest of the machine, other users' work included).
        "slurm_cpu_ms": slurm_cpu,
        "sluice_cpu_ms": sluice_cpu,
        "load": round((before + load()) / 2, 2),
    }


def wait_slurm_idle(side: SlurmSide, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run(
            ["squeue", "-h", f"--partition={PARTITION}", "-o", "%i"],
            env=side.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if not result.stdout.strip():
            return
        time.sleep(0.2)
    raise e2e.BenchError("the partition did not become idle")


def idle_starts(bench: e2e.Bench, side: SlurmSide, count: int) -> dict:
    """``count`` alternating pairs: a ``sleep 1`` straight to Slurm, then one through Sluice;
    each from its submission until it is seen RUNNING."""
    slurm, sluice = [], []
    for i in range(count):
        wait_slurm_idle(side)
        t0 = time.monotonic()
        job_id = side.sbatch(f"idle-{os.getpid()}-{i}", "sleep 1")
        while side.state(job_id) not in ("RUNNING", *SLURM_ENDED):
            if time.monotonic() - t0 > 60:
                raise e2e.BenchError(f"Slurm job {job_id} not running after 60 s")
            time.sleep(IDLE_POLL_SECONDS)
        slurm.append(time.monotonic() - t0)
        wait_slurm_idle(side)
        bench.wait_idle()
        spec = e2e._spec(bench.world, "idle", ["sleep", "1"])
        t0 = time.monotonic()
        job = bench.api.post("jobs/", spec)
        while bench.api.get(f"jobs/{job['id']}/")["state"] not in (
            "RUNNING",
            *e2e.END_STATES,
        ):
            if time.monotonic() - t0 > 60:
                raise e2e.BenchError(f"Sluice job {job['id']} not running after 60 s")
            time.sleep(IDLE_POLL_SECONDS)
        sluice.append(time.monotonic() - t0)
    return {
        "slurm_median": round(statistics.median(slurm), 3),
        "slurm_max": round(max(slurm), 3),
        "sluice_median": round(statistics.median(sluice), 3),
        "sluice_max": round(max(sluice), 3),
        "jobs": count,
        "load": round(load(), 2),
    }


def emit(figure: str, value: float, unit: str, **extra) -> dict:
    line = {"figure": figure, "value": value, "unit": unit, **extra}
    print(json.dumps(line), flush=True)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per drain (default 1000)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating drains of each")
    parser.add_argument("--idle", type=int, default=10, help="idle submit→RUNNING samples")
    parser.add_argument("--seq", type=int, default=200, help="submissions in a row (0: none)")
    parser.add_argument(
        "--runtime",
        type=float,
        default=0.0,
        help="seconds each drained job runs (sleep; default 0: true)",
    )
    parser.add_argument(
        "--refresh", type=float, default=0.25, help="the bridge's --refresh (its default)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    args = parser.parse_args()
    if not slurm_cluster.installed():
        log("Slurm and munge are not installed (apt-get install slurmctld slurmd munge)")
        return 2
    if os.geteuid() != 0:
        log("the emulated Slurm cluster needs root (slurmd runs jobs as their users)")
        return 2

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-slurm-drain-", dir="/var/tmp"))
    tmp.chmod(0o755)
    slurm_dir = tmp / "slurm"
    status = 1
    cluster = None
    try:
        backend = e2e.choose_backend("postgres", args.postgres.rstrip("/"), args.redis.rstrip("/"))
        layout = slurm_cluster.start(
            argparse.Namespace(
                dir=str(slurm_dir),
                nodes=e2e.NODES,
                gpus=e2e.GPUS_PER_NODE,
                gpu_type="h100",
                prefix="sd",
                partition=PARTITION,
                cluster="sluice",
            )
        )
        log(f"Slurm: {len(layout['nodes'])} nodes × {layout['gpus']} GPUs in {slurm_dir}")
        cluster = SluiceOnSlurm(backend, tmp, layout, args.refresh)
        cluster.prepare_database()
        world = cluster.seed()
        cluster.start()
        api = e2e.Api(cluster.url, world.pop("token"))
        bench = e2e.Bench(cluster, api, world, args.jobs, 0.0)
        bench.wait_nodes()
        side = SlurmSide(layout["slurm_conf"], tmp / "straight")
        log("warming up both")
        bench.warmup()
        slurm_drain(side, 8, 0)
        wait_slurm_idle(side)
        results = []
        for round_no in range(1, args.rounds + 1):
            log(f"round {round_no}: Slurm straight")
            wait_slurm_idle(side)
            bench.wait_idle()
            straight = slurm_drain(side, args.jobs, round_no, args.runtime)
            emit("slurm/drain", straight["rate"], "jobs/s", round=round_no, **straight)
            log(f"round {round_no}: through Sluice")
            wait_slurm_idle(side)
            through = sluice_drain(bench, args.jobs, args.runtime)
            emit("sluice/drain", through["rate"], "jobs/s", round=round_no, **through)
            results.append((straight, through))
        log("idle submit → RUNNING")
        idle = idle_starts(bench, side, args.idle)
        ratios = [b["rate"] / a["rate"] for a, b in results]
        ratio = statistics.median(ratios)
        gap = idle["sluice_median"] - idle["slurm_median"]
        emit(
            "drain_ratio",
            round(ratio, 3),
            "x",
            rounds=[round(r, 3) for r in ratios],
            target=f"≥ {RATIO_TARGET}",
            meets_target=ratio >= RATIO_TARGET,
        )
        emit("slurm/idle_start", idle["slurm_median"], "s", **idle)
        seq = None
        if args.seq:
            log(f"{args.seq} submissions in a row from one client")
            seq = sequential_submissions(bench, side, args.seq)
            emit(
                "submit_seq_ratio",
                round(seq["sluice_per_s"] / seq["slurm_per_s"], 3),
                "x",
                target="≥ 1",
                meets_target=seq["sluice_per_s"] >= seq["slurm_per_s"],
                **seq,
            )
        emit(
            "idle_gap",
            round(gap, 3),
            "s",
            target=f"≤ {IDLE_GAP_TARGET}",
            meets_target=gap <= IDLE_GAP_TARGET,
        )
        print(
            f"\nSlurm pool vs Slurm, {args.jobs} one-GPU jobs on {e2e.NODES} × "
            f"{e2e.GPUS_PER_NODE} GPUs, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}"
        )
        for i, (a, b) in enumerate(results, 1):
            print(
                f"round {i}: Slurm {a['rate']:.1f} jobs/s ({a['seconds']} s, load {a['load']}), "
                f"Sluice {b['rate']:.1f} jobs/s ({b['seconds']} s, load {b['load']}): "
                f"{b['rate'] / a['rate']:.2f}×"
            )
        print(
            f"idle submit→RUNNING median: Slurm {idle['slurm_median']} s, Sluice "
            f"{idle['sluice_median']} s (gap {gap:+.3f} s, load {idle['load']})",
            flush=True,
        )
        if seq is not None:
            print(
                f"{seq['jobs']} submissions in a row, one client: sbatch {seq['slurm_per_s']}/s, "
                f"POST {seq['sluice_per_s']}/s (load {seq['load']})",
                flush=True,
            )
        status = 0
    except KeyboardInterrupt:
        log("interrupted")
        status = 130
    except (e2e.BenchError, *e2e.API_ERRORS, subprocess.SubprocessError) as exc:
        log(f"FAILED: {exc}")
        if cluster is not None:
            print(cluster.log_tails(), file=sys.stderr)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        log("stopping")
        if cluster is not None:
            cluster.stop()
            try:
                cluster.drop()
            except (OSError, *e2e._database_errors()) as exc:
                log(f"could not drop the database: {exc}")
        slurm_cluster.stop(slurm_dir)
        if args.keep:
            log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
