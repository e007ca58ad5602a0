"""Benchmark: what running a job costs the node agent, in process, per job.

    .venv/bin/python bench/agent.py [--jobs 2000] [--gpus 8] [--repeat 3]

One agent (``scheduling.agent``) on simulated GPUs, fed ``launch`` messages through its
in-process message source and sending its reports to a list, as the agent tests wire it:
no Django, no broker. It keeps every GPU busy with one-GPU jobs running ``true`` until
``--jobs`` have ended and their exits were reported, then prints one JSON line per run:
the agent's own CPU per job (``agent_cpu_ms_per_job``: the loop, its files, its reports),
the CPU of the processes it started (``children_cpu_ms_per_job``: the job wrapper and the
job), wall time per job, and the state files written per job. As root the jobs run as
``nobody`` (as ``bench/e2e.py``'s do), else as the agent's own user.

What it leaves out: the broker (the end-to-end benchmark has it), and the agent's heartbeat
(one per minute). The figures are for comparing one version of the agent with another on the
same machine, not absolute: the machine's load moves them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduling.agent import jobstore as agent_module  # noqa: E402
from scheduling.agent.agent import Agent, AgentConfig, LocalMessageSource  # noqa: E402
from scheduling.agent.gpus import SimulatedBackend  # noqa: E402
from scheduling.agent.protocol import launch_message  # noqa: E402


def _cpu() -> tuple[float, float]:
    """(this process's CPU, its reaped children's CPU) in seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def run(jobs: int, gpus: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-agent-"))
    work.chmod(0o711)  # job accounts pass through to their workspaces
    writes = 0
    real_save = agent_module.save_record

    def counting_save(record, paths):
        nonlocal writes
        writes += 1
        real_save(record, paths)

    agent_module.save_record = counting_save
    reports: list[dict] = []
    source = LocalMessageSource()
    agent = Agent(
        AgentConfig(node="bench-1", work_dir=work / "agent", mounts_file="/dev/null"),
        SimulatedBackend(f"{gpus}xH100-80GB", "bench-1"),
        reports.append,
        source,
        base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    run_as = "nobody" if os.geteuid() == 0 else ""
    try:
        agent.start()
        free = list(range(gpus))
        sent = ended = seen = 0
        cpu0, children0 = _cpu()
        started = time.perf_counter()
        while ended < jobs:
            while free and sent < jobs:
                sent += 1
                source.put(
                    launch_message(
                        job_id=sent,
                        attempt=1,
                        name=f"bench-{sent}",
                        command=["true"],
                        gpu_indices=[free.pop()],
                        run_as=run_as,
                        tenant="bench",
                    )
                )
            agent.tick(1.0)
            for report in reports[seen:]:
                if report["type"] == "exited":
                    ended += 1
                    job = agent.jobs[(report["job_id"], report["attempt"])]
                    free.extend(job.gpu_indices)
            seen = len(reports)
        wall = time.perf_counter() - started
        cpu1, children1 = _cpu()
        failed = sum(1 for r in reports if r["type"] == "exited" and r.get("exit_code") != 0)
    finally:
        agent_module.save_record = real_save
        agent.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "bench": "agent",
        "jobs": jobs,
        "gpus": gpus,
        "agent_cpu_ms_per_job": round((cpu1 - cpu0) / jobs * 1000, 3),
        "children_cpu_ms_per_job": round((children1 - children0) / jobs * 1000, 3),
        "wall_ms_per_job": round(wall / jobs * 1000, 3),
        "state_writes_per_job": round(writes / jobs, 2),
        "reports_per_job": round(len(reports) / jobs, 2),
        "failed": failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeat):
        print(json.dumps(run(args.jobs, args.gpus)), flush=True)


if __name__ == "__main__":
    main()
