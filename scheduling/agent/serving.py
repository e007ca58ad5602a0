"""Serving jobs on the node: their ports, and the scrape of their health and
metrics endpoints into ``serve_metrics`` samples.

A serving job (a launch with ``serve``) gets a free TCP port of the agent's
``--serve-ports`` range, as ``PORT`` and ``SLUICE_SERVE_PORT`` in its environment. While it
runs, the agent GETs ``http://127.0.0.1:<port><health_path>`` (ready = a 2xx answer within
the timeout) and ``<metrics_path>`` (Prometheus text) every ``--serve-scrape`` seconds, in
threads of its own (:class:`ServeScraper`): a slow or hung replica never delays the loop's
exits, stops and reports.

The metrics of the common servers are normalised into one record
(:func:`normalise_metrics`); the first convention found wins, in this order:

- Sluice: ``sluice_requests_running``, ``sluice_requests_waiting``,
  ``sluice_requests_total``, ``sluice_request_errors_total``, histogram
  ``sluice_request_duration_seconds``;
- vLLM: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, requests =
  ``vllm:request_success_total`` (no error counter), histogram
  ``vllm:e2e_request_latency_seconds``;
- TGI: running = ``tgi_batch_current_size``, waiting = ``tgi_queue_size``, requests =
  ``tgi_request_count``, errors = ``tgi_request_failure``, histogram ``tgi_request_duration``;
- Triton: waiting = ``nv_inference_pending_request_count``, requests =
  ``nv_inference_request_success`` + ``nv_inference_request_failure``, errors =
  ``nv_inference_request_failure`` (no running gauge, no latency histogram by default).

Values of one name are summed over their label sets (models, versions, finish reasons);
a name exposed with or without ``_total`` is the same counter. What a server does not
expose is null. Standard library and ``prometheus_client``'s parser only: no Django.
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SERVE_PORTS = (20000, 29999)
DEFAULT_SCRAPE_SECONDS = 2.0
#: Seconds each GET of a scrape may take at most (connect, and each read).
DEFAULT_SCRAPE_TIMEOUT = 0.5
#: Metrics text read at most; a bigger page is cut there (and its last line dropped).
MAX_METRICS_BYTES = 4 * 1024 * 1024
#: Ports tried at most when picking one (the range may be large and mostly taken).
MAX_PORT_TRIES = 2000


# --- ports ------------------------------------------------------------------------------------


def parse_port_range(text: str) -> tuple[int, int]:
    """``"20000-29999"`` (or one port) as (low, high); ValueError when it is not a range of
    unprivileged ports."""
    low_text, _, high_text = text.strip().partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if high_text else low
    except ValueError:
        raise ValueError(f"{text!r} is not a port range such as 20000-29999") from None
    if not (1024 <= low <= high <= 65535):
        raise ValueError(f"{text!r}: give ports between 1024 and 65535, low-high")
    return low, high


def port_is_free(port: int) -> bool:
    """Whether nothing listens on (or holds) ``port``: a bind on every address succeeds.
    No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, so a replica's port is not
    handed to the next one at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class PortPicker:
    """Picks free ports of a range in turn, from after the last one picked (a port just
    released is the last to be picked again)."""

    def __init__(
        self, low: int, high: int, *, is_free: Callable[[int], bool] = port_is_free
    ) -> None:
        self.low, self.high = low, high
        self._next = low
        self._is_free = is_free

    def pick(self, taken: set[int]) -> int | None:
        """A free port of the range not in ``taken`` (the agent's serving jobs), or None."""
        size = self.high - self.low + 1
        start = self._next - self.low
        for step in range(min(size, MAX_PORT_TRIES)):
            port = self.low + (start + step) % size
            if port in taken or not self._is_free(port):
                continue
            self._next = self.low + (port - self.low + 1) % size
            return port
        return None


# --- normalisation ----------------------------------------------------------------------------

#: (running, waiting, requests_total, errors_total, latency histogram) per convention, in
#: order of preference. A tuple of names is a sum; None: the server exposes none.
_Names = str | tuple[str, ...] | None
CONVENTIONS: tuple[tuple[str, dict[str, _Names]], ...] = (
    (
        "sluice",
        {
            "running": "sluice_requests_running",
            "waiting": "sluice_requests_waiting",
            "requests_total": "sluice_requests_total",
            "errors_total": "sluice_request_errors_total",
            "latency": "sluice_request_duration_seconds",
        },
    ),
    (
        "vllm",
        {
            "running": "vllm:num_requests_running",
            "waiting": "vllm:num_requests_waiting",
            "requests_total": "vllm:request_success_total",
            "errors_total": None,
            "latency": "vllm:e2e_request_latency_seconds",
        },
    ),
    (
        "tgi",
        {
            "running": "tgi_batch_current_size",
            "waiting": "tgi_queue_size",
            "requests_total": "tgi_request_count",
            "errors_total": "tgi_request_failure",
            "latency": "tgi_request_duration",
        },
    ),
    (
        "triton",
        {
            "running": None,
            "waiting": "nv_inference_pending_request_count",
            "requests_total": ("nv_inference_request_success", "nv_inference_request_failure"),
            "errors_total": "nv_inference_request_failure",
            "latency": None,
        },
    ),
)

EMPTY_METRICS: dict[str, Any] = {
    "running": None,
    "waiting": None,
    "requests_total": None,
    "errors_total": None,
    "latency_buckets": [],
}


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def parse_samples(text: str) -> tuple[dict[str, float], dict[str, dict[float, float]]]:
    """Prometheus text as ({sample name without ``_total``: value summed over label
    sets}, {histogram name: {le: cumulative count summed over label sets}}). Raises
    ValueError on text the parser refuses."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if math.isnan(value):
                continue
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                le = float(sample.labels["le"])
                histogram = buckets.setdefault(sample.name[: -len("_bucket")], {})
                histogram[le] = histogram.get(le, 0.0) + value
                continue
            name = _base(sample.name)
            values[name] = values.get(name, 0.0) + value
    return values, buckets


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _value(values: dict[str, float], names: _Names) -> float | None:
    if names is None:
        return None
    names = (names,) if isinstance(names, str) else names
    found = [values[_base(n)] for n in names if _base(n) in values]
    return _finite(sum(found)) if found else None


def latency_buckets(histogram: dict[float, float]) -> list[list[float | None]]:
    """A cumulative histogram as [[le, count], ...] in increasing ``le``, +Inf as None."""
    rows: list[list[float | None]] = []
    for le in sorted(histogram):
        count = histogram[le]
        if not math.isfinite(count):
            continue
        rows.append([None if math.isinf(le) else le, count])
    return rows


def normalise_metrics(text: str) -> dict[str, Any]:
    """The serving fields of a ``serve_metrics`` sample from a metrics page (nulls and no
    buckets where the page says nothing known, or cannot be parsed)."""
    try:
        values, histograms = parse_samples(text)
    except Exception as exc:  # the parser's errors are ValueError, and worse on bad input
        logger.debug("cannot parse a metrics page: %s", exc)
        return dict(EMPTY_METRICS, latency_buckets=[])
    for _, names in CONVENTIONS:
        known = [n for n in names.values() if n is not None]
        flat = [m for n in known for m in ((n,) if isinstance(n, str) else n)]
        if not any(_base(n) in values or n in histograms for n in flat):
            continue
        latency = names["latency"]
        histogram = histograms.get(latency, {}) if isinstance(latency, str) else {}
        return {
            "running": _value(values, names["running"]),
            "waiting": _value(values, names["waiting"]),
            "requests_total": _value(values, names["requests_total"]),
            "errors_total": _value(values, names["errors_total"]),
            "latency_buckets": latency_buckets(histogram),
        }
    return dict(EMPTY_METRICS, latency_buckets=[])


# --- scraping ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeTarget:
    """One serving job to scrape."""

    job_id: int
    attempt: int
    port: int
    health_path: str = "/health"
    metrics_path: str = "/metrics"


def http_get(
    port: int, path: str, timeout: float, limit: int = MAX_METRICS_BYTES
) -> tuple[int, bytes]:
    """GET ``http://127.0.0.1:<port><path>`` as HTTP/1.0 (no chunked answer, the server
    closes when done): (status, body up to ``limit`` bytes). Connecting may take
    ``timeout``, the whole answer ``4 × timeout``: a replica trickling its answer byte by
    byte is cut off (TimeoutError), whatever part it is in. Not urllib: it would go
    through the node's HTTP proxy settings."""
    deadline = time.monotonic() + 4 * timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(
            f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/plain\r\nConnection: close\r\n\r\n".encode("latin-1")
        )
        data = bytearray()
        head_end = -1
        body_limit = limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"port {port}{path}: the answer takes too long")
            conn.settimeout(min(timeout, left))
            chunk = conn.recv(64 * 1024)
            if not chunk:
                break
            data += chunk
            if head_end < 0:
                head_end = data.find(b"\r\n\r\n")
                if head_end < 0 and len(data) > 64 * 1024:
                    raise http.client.HTTPException(f"port {port}{path}: headers too long")
                if head_end >= 0:
                    body_limit = head_end + 4 + limit
                    length = _content_length(bytes(data[:head_end]))
                    if length is not None:
                        body_limit = head_end + 4 + min(limit, length)
            if head_end >= 0 and len(data) >= body_limit:
                break
    if head_end < 0:
        raise http.client.HTTPException(f"port {port}{path}: no complete answer")
    status_line = bytes(data[: data.find(b"\r\n")]).decode("latin-1").split()
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
        raise http.client.HTTPException(f"port {port}{path}: not an HTTP answer")
    try:
        status = int(status_line[1])
    except ValueError:
        raise http.client.HTTPException(f"port {port}{path}: bad status") from None
    return status, bytes(data[head_end + 4 : body_limit])


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                return max(0, int(value.strip()))
            except ValueError:
                return None
    return None


def scrape(target: ServeTarget, timeout: float = DEFAULT_SCRAPE_TIMEOUT) -> dict[str, Any]:
    """One sample of a serving job (see the protocol's ``serve_metrics``)."""
    scraped_at = time.time()
    try:
        status, _ = http_get(target.port, target.health_path, timeout, limit=4096)
        ready = 200 <= status < 300
    except (OSError, http.client.HTTPException):
        ready = False
    metrics = dict(EMPTY_METRICS, latency_buckets=[])
    try:
        status, body = http_get(target.port, target.metrics_path, timeout)
    except (OSError, http.client.HTTPException):
        pass
    else:
        if 200 <= status < 300:
            text = body.decode("utf-8", "replace")
            if len(body) >= MAX_METRICS_BYTES:
                text = text[: text.rfind("\n") + 1]
            metrics = normalise_metrics(text)
    return {
        "job_id": target.job_id,
        "attempt": target.attempt,
        "port": target.port,
        "ready": ready,
        **metrics,
        "scraped_at": scraped_at,
    }


class ServeScraper:
    """Scrape rounds in worker threads, one round at a time: :meth:`start_round` returns
    at once, ``on_done`` is called (from a worker) when the round's last target is done,
    and :meth:`take_results` then hands its samples over, once."""

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_SCRAPE_TIMEOUT,
        on_done: Callable[[], None] | None = None,
        workers: int = 8,
        scrape_one: Callable[[ServeTarget, float], dict[str, Any]] = scrape,
    ) -> None:
        self.timeout = timeout
        self._on_done = on_done
        self._workers = workers
        self._scrape_one = scrape_one
        self._pool: ThreadPoolExecutor | None = None
        self._round: list[Future] | None = None
        self._left = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> bool:
        return self._round is not None

    def start_round(self, targets: list[ServeTarget]) -> bool:
        """Start scraping ``targets``; False (nothing done) while a round is in flight."""
        if self._round is not None or not targets:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._workers, thread_name_prefix="serve-scrape"
            )
        with self._lock:
            self._left = len(targets)
        self._round = [self._pool.submit(self._scrape_one, t, self.timeout) for t in targets]
        for future in self._round:
            future.add_done_callback(self._one_done)
        return True

    def _one_done(self, _: Future) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last and self._on_done is not None:
            self._on_done()

    def take_results(self) -> list[dict[str, Any]] | None:
        """The samples of the round in flight once it is done (None before, or with no
        round); a target whose scrape raised is left out."""
        if self._round is None or not all(f.done() for f in self._round):
            return None
        samples = []
        for future in self._round:
            if future.exception() is None:
                samples.append(future.result())
            else:
                logger.warning("scraping a serving job failed: %s", future.exception())
        self._round = None
        return samples

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._round = None
