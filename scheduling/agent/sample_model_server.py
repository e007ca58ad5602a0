"""A sample model server for serving jobs: standard library only.

It stands in for vLLM / TGI / Triton in the demo, the tests and the inference bench: each
request spends ``--service-ms`` of simulated GPU time, at most ``--concurrency`` at once
(the others wait, and are counted as waiting), and the server exposes what a real one
does, under Sluice's own metric names::

    python -m scheduling.agent.sample_model_server            # binds 0.0.0.0:$PORT

- ``GET /health``: 503 during the first ``--warmup`` seconds (loading the model), then 200;
- ``GET /metrics``: Prometheus text: ``sluice_requests_running``,
  ``sluice_requests_waiting`` (gauges), ``sluice_requests_total``,
  ``sluice_request_errors_total`` (counters), ``sluice_request_duration_seconds``
  (histogram of the time from arrival to answer, buckets 0.005 s to 10 s, plus the
  service's latency SLO from ``SERVE_LATENCY_SLO_SECONDS`` when set, so that the share of
  requests within the SLO is exact);
- ``POST /v1/completions`` (an OpenAI-like answer) and ``GET /infer``: one request;
  ``--error-rate`` of them fail with a 500 after their service time. Before the warm-up is
  over they are refused with 503 (not counted).

SIGTERM stops it cleanly (exit code 0), as a replica drained by its agent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Upper bounds of the latency histogram's buckets (seconds), +Inf implied.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def buckets_with_slo(slo_seconds: str | None) -> tuple[float, ...]:
    """BUCKETS with the SLO (seconds, as the service passes it) among them; a value that is
    not a positive number is ignored."""
    try:
        slo = float(slo_seconds or "")
    except ValueError:
        return BUCKETS
    if not 0 < slo < float("inf"):
        return BUCKETS
    return tuple(sorted(set(BUCKETS) | {slo}))


class ModelStats:
    """The server's counters; every change under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.requests = 0
        self.errors = 0
        self.buckets = buckets_with_slo(os.environ.get("SERVE_LATENCY_SLO_SECONDS"))
        self.bucket_counts = [0] * len(self.buckets)
        self.duration_sum = 0.0

    def observe(self, seconds: float, failed: bool) -> None:
        with self.lock:
            self.requests += 1
            self.errors += failed
            self.duration_sum += seconds
            for i, le in enumerate(self.buckets):
                if seconds <= le:
                    self.bucket_counts[i] += 1

    def render(self) -> str:
        with self.lock:
            lines = [
                "# HELP sluice_requests_running Requests being served now.",
                "# TYPE sluice_requests_running gauge",
                f"sluice_requests_running {self.running}",
                "# HELP sluice_requests_waiting Requests waiting for a free slot.",
                "# TYPE sluice_requests_waiting gauge",
                f"sluice_requests_waiting {self.waiting}",
                "# HELP sluice_requests_total Requests answered (errors included).",
                "# TYPE sluice_requests_total counter",
                f"sluice_requests_total {self.requests}",
                "# HELP sluice_request_errors_total Requests answered with an error.",
                "# TYPE sluice_request_errors_total counter",
                f"sluice_request_errors_total {self.errors}",
                "# HELP sluice_request_duration_seconds Time from arrival to answer.",
                "# TYPE sluice_request_duration_seconds histogram",
            ]
            for le, count in zip(self.buckets, self.bucket_counts, strict=True):
                lines.append(f'sluice_request_duration_seconds_bucket{{le="{le}"}} {count}')
            lines.append(f'sluice_request_duration_seconds_bucket{{le="+Inf"}} {self.requests}')
            lines.append(f"sluice_request_duration_seconds_sum {self.duration_sum}")
            lines.append(f"sluice_request_duration_seconds_count {self.requests}")
        return "\n".join(lines) + "\n"


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, *, service_ms, concurrency, warmup, error_rate, verbose=False):
        super().__init__(address, Handler)
        self.service_seconds = max(0.0, service_ms / 1000.0)
        self.slots = threading.BoundedSemaphore(max(1, concurrency))
        self.ready_at = time.monotonic() + max(0.0, warmup)
        self.error_rate = min(1.0, max(0.0, error_rate))
        self.verbose = verbose
        self.stats = ModelStats()

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def infer(self) -> bool:
        """Serve one request: wait for a slot, spend the service time; True if it failed."""
        arrived = time.monotonic()
        stats = self.stats
        with stats.lock:
            stats.waiting += 1
        self.slots.acquire()
        try:
            with stats.lock:
                stats.waiting -= 1
                stats.running += 1
            time.sleep(self.service_seconds)  # the simulated GPU time
            failed = random.random() < self.error_rate
            with stats.lock:
                stats.running -= 1
        finally:
            self.slots.release()
        stats.observe(time.monotonic() - arrived, failed)
        return failed


class Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        path = self.path.split("?", 1)[0]
        if path == "/health":
            ready = self.server.ready
            self._answer(200 if ready else 503, {"ready": ready})
        elif path == "/metrics":
            body = self.server.stats.render().encode()
            self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/infer":
            self._infer()
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        if self.path.split("?", 1)[0] in ("/v1/completions", "/infer"):
            self._infer()
        else:
            self._answer(404, {"error": "not found"})

    def _infer(self) -> None:
        if not self.server.ready:
            self._answer(503, {"error": "loading"})
            return
        failed = self.server.infer()
        if failed:
            self._answer(500, {"error": "simulated failure"})
            return
        self._answer(
            200,
            {
                "object": "text_completion",
                "model": "sluice-sample",
                "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
            },
        )

    def _answer(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        if self.server.verbose:
            super().log_message(format, *args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--port", type=int, default=None, help="port to bind (default: $PORT, else 8000)"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--service-ms", type=float, default=50.0, help="GPU time per request")
    parser.add_argument("--concurrency", type=int, default=4, help="requests served at once")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds /health says 503")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of requests failing")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    port = args.port if args.port is not None else int(os.environ.get("PORT") or 8000)
    server = ModelServer(
        (args.host, port),
        service_ms=args.service_ms,
        concurrency=args.concurrency,
        warmup=args.warmup,
        error_rate=args.error_rate,
        verbose=args.verbose,
    )

    def stop(*_) -> None:
        # shutdown() waits for serve_forever to return: not from the thread running it.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"sample model server on {args.host}:{server.server_address[1]} "
        f"({args.service_ms:g} ms per request, {args.concurrency} at once, "
        f"ready in {args.warmup:g} s)",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    print("sample model server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
