"""Serving jobs on the wire: the launch carries ``serve``; ``serve_metrics``
reports and the ``port`` of ``started`` follow the protocol."""

import pytest

from scheduling.agent import protocol as p
from scheduling.choices import WorkloadType
from scheduling.services.dispatch import dispatch_cycle
from tests import factories as f


def _launches(outbox):
    return [m for _, m in outbox if m["type"] == "launch"]


def _job(world, **kw):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        base_priority_class=world.normal,
        priority_class=world.normal,
        **kw,
    )


def test_the_launch_of_a_serving_job_carries_its_paths(
    world, outbox, django_capture_on_commit_callbacks
):
    serving = _job(
        world,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/ready", "metrics_path": "/stats"},
    )
    plain = _job(world, workload_type=WorkloadType.INFERENCE)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    launches = {m["job_id"]: m for m in _launches(outbox)}
    assert launches[serving.pk]["serve"] == {"health_path": "/ready", "metrics_path": "/stats"}
    assert "serve" not in launches[plain.pk]
    for message in launches.values():
        assert p.validate_control_message(message) is message


def test_launch_message_fills_the_default_paths():
    message = p.launch_message(
        job_id=1, attempt=0, name="x", command=["x"], gpu_indices=[0], serve={"health_path": "/h"}
    )
    assert message["serve"] == {"health_path": "/h", "metrics_path": "/metrics"}
    message = p.launch_message(job_id=1, attempt=0, name="x", command=["x"], gpu_indices=[0])
    assert "serve" not in message


@pytest.mark.parametrize(
    "serve", [{"health_path": "health"}, {"health_path": 3}, {"port": "/x"}, ["/h"]]
)
def test_a_launch_with_a_bad_serve_is_refused(serve):
    message = p.launch_message(job_id=1, attempt=0, name="x", command=["x"], gpu_indices=[0])
    message["serve"] = serve
    with pytest.raises(p.ProtocolError, match="serve"):
        p.validate_control_message(message)


def _sample(**overrides):
    return {
        "job_id": 4,
        "attempt": 0,
        "port": 20001,
        "ready": True,
        "running": 2.0,
        "waiting": None,
        "requests_total": 10,
        "errors_total": 0,
        "latency_buckets": [[0.1, 3], [1.0, 9], [None, 10]],
        "scraped_at": 1000.5,
        **overrides,
    }


def test_serve_metrics_report_is_valid():
    report = p.serve_metrics_report(node="gpu-01", samples=[_sample()])
    assert report["type"] == "serve_metrics" and report["node"] == "gpu-01"
    assert p.validate_report(report) is report
    assert p.SERVE_METRICS in p.REPORT_TYPES


@pytest.mark.parametrize(
    "change",
    [
        {"ready": "yes"},
        {"running": "2"},
        {"running": float("nan")},
        {"port": None},
        {"latency_buckets": [[None, 3], [1.0, 9]]},
        {"latency_buckets": [[0.1]]},
        {"latency_buckets": [[float("inf"), 3]]},
        {"scraped_at": None},
    ],
)
def test_a_bad_serve_sample_is_refused(change):
    with pytest.raises(p.ProtocolError, match="serve_metrics"):
        p.serve_metrics_report(node="gpu-01", samples=[_sample(**change)])
    bad = _sample()
    del bad["job_id"]
    with pytest.raises(p.ProtocolError, match="job_id"):
        p.serve_metrics_report(node="gpu-01", samples=[bad])


def test_started_report_carries_the_port_of_a_serving_job():
    report = p.started_report(node="n", job_id=1, attempt=0, pid=5, started_at=1.0, port=20007)
    assert p.validate_report(report)["port"] == 20007
    plain = p.started_report(node="n", job_id=1, attempt=0, pid=5, started_at=1.0)
    assert "port" not in plain
    with pytest.raises(p.ProtocolError, match="port"):
        p.validate_report({**report, "port": "20007"})
