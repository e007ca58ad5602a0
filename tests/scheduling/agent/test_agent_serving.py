"""Serving jobs on the node: ports, ``PORT``, scrapes of health and metrics, the
normalisation of the common servers' metrics, and ``serve_metrics`` reports."""

from __future__ import annotations

import http.client
import shutil
import threading
from pathlib import Path

import pytest

from scheduling.agent import sample_model_server
from scheduling.agent.protocol import validate_report
from scheduling.agent.serving import (
    PortPicker,
    ServeScraper,
    ServeTarget,
    normalise_metrics,
    parse_port_range,
    port_is_free,
)
from tests.scheduling.agent.helpers import PYTHON, launch, python_job, stop

# --- normalisation of the servers' conventions ----------------------------------------------

VLLM = """
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 5.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="llama"} 90.0
vllm:request_success_total{finished_reason="length",model_name="llama"} 10.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="llama"} 20.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="llama"} 80.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="llama"} 100.0
vllm:e2e_request_latency_seconds_count{model_name="llama"} 100.0
vllm:e2e_request_latency_seconds_sum{model_name="llama"} 55.0
"""

TGI = """
# TYPE tgi_queue_size gauge
tgi_queue_size 7
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 2
# TYPE tgi_request_count counter
tgi_request_count 40
# TYPE tgi_request_failure counter
tgi_request_failure{err="validation"} 1
tgi_request_failure{err="overloaded"} 2
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 10
tgi_request_duration_bucket{le="2"} 36
tgi_request_duration_bucket{le="+Inf"} 37
tgi_request_duration_sum 30.5
tgi_request_duration_count 37
"""

TRITON = """
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="resnet",version="1"} 120
nv_inference_request_success{model="bert",version="1"} 30
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="resnet",version="1"} 4
nv_inference_request_failure{model="bert",version="1"} 1
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="resnet",version="1"} 60
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="resnet",version="1"} 6
nv_inference_pending_request_count{model="bert",version="1"} 0
"""

SLUICE = """
# TYPE sluice_requests_running gauge
sluice_requests_running 4
# TYPE sluice_requests_waiting gauge
sluice_requests_waiting 9
# TYPE sluice_requests_total counter
sluice_requests_total 250
# TYPE sluice_request_errors_total counter
sluice_request_errors_total 3
# TYPE sluice_request_duration_seconds histogram
sluice_request_duration_seconds_bucket{le="0.05"} 100
sluice_request_duration_seconds_bucket{le="0.1"} 240
sluice_request_duration_seconds_bucket{le="+Inf"} 250
sluice_request_duration_seconds_sum 20
sluice_request_duration_seconds_count 250
"""


def test_vllm_metrics_are_normalised():
    assert normalise_metrics(VLLM) == {
        "running": 3.0,
        "waiting": 5.0,
        "requests_total": 100.0,
        "errors_total": None,
        "latency_buckets": [[0.3, 20.0], [1.0, 80.0], [None, 100.0]],
    }


def test_tgi_metrics_are_normalised():
    assert normalise_metrics(TGI) == {
        "running": 2.0,
        "waiting": 7.0,
        "requests_total": 40.0,
        "errors_total": 3.0,
        "latency_buckets": [[0.5, 10.0], [2.0, 36.0], [None, 37.0]],
    }


def test_triton_metrics_are_normalised():
    assert normalise_metrics(TRITON) == {
        "running": None,
        "waiting": 6.0,
        "requests_total": 155.0,
        "errors_total": 5.0,
        "latency_buckets": [],
    }


def test_sluice_metrics_are_normalised_and_win_over_others():
    expected = {
        "running": 4.0,
        "waiting": 9.0,
        "requests_total": 250.0,
        "errors_total": 3.0,
        "latency_buckets": [[0.05, 100.0], [0.1, 240.0], [None, 250.0]],
    }
    assert normalise_metrics(SLUICE) == expected
    assert normalise_metrics(VLLM + SLUICE) == expected


@pytest.mark.parametrize("text", ["", "# nothing\nprocess_cpu_seconds_total 3\n", "}{ not metrics"])
def test_unknown_or_bad_metrics_give_nulls(text):
    assert normalise_metrics(text) == {
        "running": None,
        "waiting": None,
        "requests_total": None,
        "errors_total": None,
        "latency_buckets": [],
    }


# --- ports ------------------------------------------------------------------------------------


def test_port_ranges_are_parsed():
    assert parse_port_range("20000-29999") == (20000, 29999)
    assert parse_port_range("21000") == (21000, 21000)
    for bad in ("80-90", "30000-20000", "a-b", "20000-70000"):
        with pytest.raises(ValueError):
            parse_port_range(bad)


def test_port_picker_skips_taken_and_busy_ports_and_goes_round():
    busy = {20001}
    picker = PortPicker(20000, 20003, is_free=lambda p: p not in busy)
    assert picker.pick({20000}) == 20002
    assert picker.pick(set()) == 20003
    assert picker.pick(set()) == 20000  # round again from the start
    assert picker.pick({20000, 20002, 20003}) is None


def test_a_port_in_use_is_not_free():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not port_is_free(s.getsockname()[1])


# --- the agent ---------------------------------------------------------------------------------

SHOW_PORT = (
    "import os; print('PORT=' + str(os.environ.get('PORT')) + ' SERVE=' + "
    "str(os.environ.get('SLUICE_SERVE_PORT')), flush=True)"
)


def _free_range(size: int = 20) -> tuple[int, int]:
    for low in range(24000, 29000, size):
        if all(port_is_free(p) for p in range(low, low + size)):
            return low, low + size - 1
    raise AssertionError("no free port range")


def test_serving_jobs_get_distinct_ports_as_port(make_agent):
    low, high = _free_range()
    h = make_agent(serve_ports=(low, high))
    h.send(launch(1, python_job(SHOW_PORT), gpu_indices=[0], serve={"health_path": "/h"}))
    h.send(launch(2, python_job(SHOW_PORT), gpu_indices=[1], serve={"health_path": "/h"}))
    h.send(launch(3, python_job(SHOW_PORT), gpu_indices=[2], env={"PORT": "1"}))
    for job in (1, 2, 3):
        h.wait_report("exited", job)
    h.wait_for(lambda: all("PORT=" in h.log_text(j) for j in (1, 2, 3)))
    ports = {}
    for job in (1, 2):
        [started] = h.of_type("started", job)
        port = started["port"]
        assert low <= port <= high
        assert h.log_text(job).strip() == f"PORT={port} SERVE={port}"
        ports[job] = port
        validate_report(started)
    assert ports[1] != ports[2]
    # Not a serving job: no port given, the user's PORT kept, no SLUICE_SERVE_PORT.
    [started] = h.of_type("started", 3)
    assert "port" not in started
    assert h.log_text(3).strip() == "PORT=1 SERVE=None"


def test_a_serving_job_without_a_free_port_fails_to_launch(make_agent):
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        h = make_agent(serve_ports=(port, port))
        h.send(launch(1, python_job("print(1)"), serve={"health_path": "/h"}))
        exited = h.wait_report("exited", 1)
    assert exited["stop_reason"] == "launch_failed"
    assert "no free port" in exited["message"]


@pytest.fixture
def model_server(tmp_path) -> Path:
    """The sample server where the job accounts can read it (the agent runs jobs as an
    unprivileged account when the tests run as root)."""
    path = tmp_path / "sample_model_server.py"
    shutil.copy(sample_model_server.__file__, path)
    path.chmod(0o644)
    return path


def _get(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_the_sample_server_as_a_serving_job_is_scraped(make_agent, model_server):
    low, high = _free_range()
    h = make_agent(serve_ports=(low, high), serve_scrape_seconds=0.2, heartbeat_seconds=0.5)
    command = [PYTHON, str(model_server), "--warmup", "1", "--service-ms", "5"]
    h.send(launch(1, command, serve={"health_path": "/health", "metrics_path": "/metrics"}))
    port = h.wait_report("started", 1)["port"]

    def samples():
        return [s for r in h.of_type("serve_metrics") for s in r["samples"]]

    # Warming up: not ready; then ready, with Sluice's metrics read.
    h.wait_for(lambda: any(not s["ready"] and s["requests_total"] == 0 for s in samples()))
    h.wait_for(lambda: any(s["ready"] for s in samples()))
    for _ in range(5):
        assert _get(port, "/infer") == 200
    last = h.wait_for(
        lambda: next((s for s in reversed(samples()) if (s["requests_total"] or 0) >= 5), None)
    )
    assert last == {**last, "job_id": 1, "attempt": 1, "port": port, "ready": True}
    assert last["errors_total"] == 0 and last["running"] == 0 and last["waiting"] == 0
    assert last["latency_buckets"][-1] == [None, 5.0]
    assert [le for le, _ in last["latency_buckets"][:-1]] == list(sample_model_server.BUCKETS)
    for report in h.of_type("serve_metrics"):
        validate_report(report)
        assert len({s["job_id"] for s in report["samples"]}) == len(report["samples"])
    # The heartbeat lists the job with its port.
    beat = h.wait_for(lambda: [b for b in h.of_type("heartbeat") if b["jobs"]])
    assert beat[-1]["jobs"][0]["port"] == port
    # Stopped (the server exits 0 on SIGTERM): no scrape of it afterwards.
    h.send(stop(1))
    exited = h.wait_report("exited", 1)
    assert exited["exit_code"] == 0
    count = len(h.of_type("serve_metrics"))
    for _ in range(20):
        h.agent.tick(0.02)
    assert len(h.of_type("serve_metrics")) == count


def test_no_scrape_without_serving_jobs(make_agent):
    h = make_agent(serve_scrape_seconds=0.05)
    h.send(launch(1, python_job("import time; time.sleep(0.5)")))
    h.wait_report("exited", 1)
    assert not h.of_type("serve_metrics")
    assert not h.agent._scraper.in_flight


def test_a_hung_replica_does_not_hold_up_the_loop(make_agent, tmp_path):
    """The scrape runs in the scraper's threads: while one hangs, the loop still starts
    jobs and reports their exits, and the scrape's samples come when it is done."""
    low, high = _free_range()
    h = make_agent(serve_ports=(low, high), serve_scrape_seconds=0.05)
    release = threading.Event()
    scraped: list[ServeTarget] = []

    def hung_scrape(target: ServeTarget, timeout: float) -> dict:
        scraped.append(target)
        release.wait(30)
        return {
            "job_id": target.job_id,
            "attempt": target.attempt,
            "port": target.port,
            "ready": True,
            "running": None,
            "waiting": None,
            "requests_total": None,
            "errors_total": None,
            "latency_buckets": [],
            "scraped_at": 1.0,
        }

    h.agent._scraper._scrape_one = hung_scrape
    h.send(launch(1, python_job("import time; time.sleep(60)"), serve={"health_path": "/h"}))
    h.wait_for(lambda: scraped)
    h.send(launch(2, python_job("print('quick')"), gpu_indices=[1]))
    assert h.wait_report("exited", 2)["exit_code"] == 0
    assert not h.of_type("serve_metrics") and len(scraped) == 1  # one round at a time
    release.set()
    report = h.wait_report("serve_metrics")
    assert [s["job_id"] for s in report["samples"]] == [1]


def test_scraper_rounds_do_not_overlap_and_wake_the_caller():
    woken = threading.Event()
    release = threading.Event()
    scraper = ServeScraper(
        on_done=woken.set, scrape_one=lambda target, timeout: release.wait(5) and {"t": target}
    )
    try:
        targets = [ServeTarget(1, 0, 20000), ServeTarget(2, 0, 20001)]
        assert scraper.start_round(targets)
        assert not scraper.start_round(targets)
        assert scraper.take_results() is None
        release.set()
        assert woken.wait(5)
        assert scraper.take_results() == [{"t": targets[0]}, {"t": targets[1]}]
        assert scraper.take_results() is None and not scraper.in_flight
    finally:
        scraper.close()


def test_a_restarted_agent_scrapes_the_serving_job_it_adopts(make_agent, model_server, tmp_path):
    low, high = _free_range(2)
    work = tmp_path / "work"
    first = make_agent(work_dir=work, serve_ports=(low, high), serve_scrape_seconds=0.1)
    command = [PYTHON, str(model_server), "--warmup", "0"]
    first.send(launch(1, command, serve={"health_path": "/health"}))
    port = first.wait_report("started", 1)["port"]
    first.agent.close()  # the agent stops; the replica does not

    second = make_agent(work_dir=work, serve_ports=(low, high), serve_scrape_seconds=0.1)
    assert second.of_type("register")[0]["jobs"][0]["port"] == port
    sample = second.wait_for(
        lambda: next(
            (s for r in second.of_type("serve_metrics") for s in r["samples"] if s["ready"]),
            None,
        )
    )
    assert (sample["job_id"], sample["port"], sample["requests_total"]) == (1, port, 0)
    # The adopted replica's port is not given to a new serving job.
    second.send(launch(2, python_job(SHOW_PORT), gpu_indices=[1], serve={"health_path": "/"}))
    assert second.wait_report("started", 2)["port"] == ({low, high} - {port}).pop()


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Slow: "],
    ids=["body", "headers"],
)
def test_a_replica_trickling_its_answer_is_cut_off(head):
    """Each read has the timeout, the whole answer four times it: a replica sending a byte
    every 0.1 s does not hold a scrape round (and every replica's samples) for long."""
    import socket
    import time

    from scheduling.agent.serving import scrape

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    done = threading.Event()

    def trickle():
        while not done.is_set():
            try:
                server.settimeout(0.2)
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(head)
                while not done.is_set():
                    try:
                        conn.sendall(b"#")
                    except OSError:
                        break
                    time.sleep(0.1)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        began = time.monotonic()
        sample = scrape(ServeTarget(1, 0, port), timeout=0.3)
        took = time.monotonic() - began
    finally:
        done.set()
        thread.join(5)
        server.close()
    assert sample["ready"] is False and sample["requests_total"] is None
    assert took < 10  # two GETs of at most 4 × 0.3 s each, not 100,000 × 0.1 s
