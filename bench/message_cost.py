"""Benchmark: what a broker message costs the control side, before its report is applied.

    .venv/bin/python bench/message_cost.py [--redis redis://127.0.0.1:6379/9] [--messages 2000]

Three ways of taking N one-heartbeat messages off a Redis queue (a database of its own,
emptied first and at the end), in CPU milliseconds per message:

* ``celery_task``: a Celery worker (``celery -A portal worker``, prefork, concurrency 2,
  the production settings with ``DEBUG=0``) running ``scheduling.reports_probe``, the
  lightest task of the reports queue (a cache write): the Celery cost of one message, the
  worker's processes' CPU from /proc;
* ``drain_acked``: the heartbeat drain's way (``scheduling.services.heartbeats``): kombu's
  ``SimpleQueue.get_nowait`` and the acknowledgement, message by message, in this process;
* ``drain_unacked``: the same without acknowledgements (what at-least-once delivery costs).

The reports themselves are not applied (``bench/reports.py`` measures that). Prints one JSON
line per way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUEUE = "bench-heartbeats"


def _beat(node: str) -> dict:
    return {
        "type": "heartbeat",
        "node": node,
        "sent_at": time.time(),
        "gpus": [
            {"index": i, "utilization": 95.0, "memory_used_mb": 60000, "processes": []}
            for i in range(8)
        ],
        "jobs": [{"job_id": 1, "attempt": 0, "pid": 0, "running": True, "stop_reason": None}],
        "zombies": [],
        "kills": [],
    }


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:13]))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += stats.get(current, (0, 0))[1]
        todo += [child for child, (parent, _) in stats.items() if parent == current]
    return total / os.sysconf("SC_CLK_TCK")


def _app(url: str):
    from celery import Celery

    app = Celery("bench-messages", broker=url, set_as_current=False, fixups=[])
    app.conf.update(task_serializer="json", task_ignore_result=True, result_backend=None)
    return app


def celery_task(url: str, count: int) -> dict:
    import redis

    env = dict(os.environ, CELERY_BROKER_URL=url, REDIS_URL=url, DEBUG="0")
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    celery = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--queues", QUEUE]
    worker = subprocess.Popen(
        [*celery, "--concurrency", "2", "--loglevel", "INFO", "--hostname", "bench-messages@%h"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(url)
    try:
        time.sleep(10)  # started and idle
        before = _tree_cpu(worker.pid)
        app = _app(url)
        for _ in range(count):
            app.send_task("scheduling.reports_probe", args=[time.time()], queue=QUEUE)
        while client.llen(QUEUE) > 0:
            time.sleep(0.2)
        time.sleep(2)  # the last tasks run
        used = _tree_cpu(worker.pid) - before
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return {"way": "celery_task", "messages": count, "cpu_ms_per_message": 1000 * used / count}


def drain(url: str, count: int, *, acked: bool) -> dict:
    from scheduling.agent.transport import broker_connection

    app = _app(url)
    for i in range(count):
        app.send_task("scheduling.agent_reports", args=[[_beat(f"n{i}")]], queue=QUEUE)
    before = resource.getrusage(resource.RUSAGE_SELF)
    taken = 0
    with broker_connection(url) as connection:
        source = connection.SimpleQueue(QUEUE, accept=["json"], no_ack=not acked)
        messages = []
        while True:
            try:
                message = source.get_nowait()
            except source.Empty:
                break
            assert message.payload[0][0][0]["type"] == "heartbeat"
            messages.append(message)
            taken += 1
        if acked:
            for message in messages:
                message.ack()
        source.close()
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    way = "drain_acked" if acked else "drain_unacked"
    return {"way": way, "messages": taken, "cpu_ms_per_message": 1000 * used / max(1, taken)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    import redis

    client = redis.Redis.from_url(args.redis)
    client.flushdb()
    try:
        for result in (
            drain(args.redis, args.messages, acked=True),
            drain(args.redis, args.messages, acked=False),
            celery_task(args.redis, args.messages),
        ):
            result["cpu_ms_per_message"] = round(result["cpu_ms_per_message"], 3)
            result["load_avg_1m"] = round(os.getloadavg()[0], 2)
            print(json.dumps(result), flush=True)
    finally:
        client.flushdb()
    return 0


if __name__ == "__main__":
    sys.exit(main())
