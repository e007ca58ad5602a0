"""``manage.py simulate`` on a plain CSV trace, and ``manage.py export_jobs_csv``."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.simulator.readers import parse_csv
from tests import factories as f

TRACE = """job_id,submit_time,duration,num_gpus,tenant,priority_class
a,0,3600,8,nlp,normal
b,60,3600,8,vision,normal
c,120,600,2,nlp,high
d,180,1200,4,vision,low
e,240,300,1,nlp,
"""


def test_simulate_prints_a_table_and_writes_json_csv_and_chart(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text(TRACE)
    out = io.StringIO()

    call_command("simulate", trace=str(trace), out=tmp_path / "sim", workers=1, nodes=1, stdout=out)

    text = out.getvalue()
    assert "pool default: 1 node x 8 GPUs as asked" in text
    assert "  sluice: replayed in " in text
    for policy in ("fifo", "sluice", "sluice-no-backfill"):
        assert f"\n{policy} " in text
    data = json.loads((tmp_path / "sim" / "mine.json").read_text())
    assert [entry["summary"]["policy"] for entry in data["policies"]] == [
        "fifo",
        "sluice",
        "sluice-no-backfill",
    ]
    assert all(entry["summary"]["completed"] == 5 for entry in data["policies"])
    assert (tmp_path / "sim" / "mine.csv").read_text().startswith("trace,policy,jobs")
    assert (tmp_path / "sim" / "mine.png").read_bytes().startswith(b"\x89PNG")


def test_simulate_refuses_an_unknown_policy_or_trace(tmp_path):
    with pytest.raises(CommandError, match="unknown policy"):
        call_command("simulate", trace="itp-2021", policy="lottery", out=tmp_path)
    with pytest.raises(CommandError, match="no trace"):
        call_command("simulate", trace=str(tmp_path / "missing.csv"), out=tmp_path)


def test_simulate_draws_the_classes_missing_with_the_mix_asked(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text(TRACE)  # job e has no class
    out = io.StringIO()

    call_command(
        "simulate",
        trace=str(trace),
        policy="sluice",
        class_mix="low=1",
        out=tmp_path / "sim",
        workers=1,
        nodes=1,
        stdout=out,
    )

    assert "classes: none in the trace; drawn: low 100%" in out.getvalue()
    by_class = json.loads((tmp_path / "sim" / "mine.json").read_text())["policies"][0][
        "wait_by_class"
    ]
    jobs = {name: figures["jobs"] for name, figures in by_class.items()}
    assert jobs == {"normal": 2, "high": 1, "low": 2}  # d, and e drawn "low"
    with pytest.raises(CommandError, match="'x' is not a number"):
        call_command("simulate", trace=str(trace), class_mix="low=x", out=tmp_path / "sim")


@pytest.mark.django_db
def test_export_jobs_csv_writes_finished_jobs_in_the_trace_format(world, tmp_path):
    started = timezone.now() - timezone.timedelta(hours=2)
    done = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.SUCCEEDED,
        gpus_per_node=4,
        nodes=2,
        gpu_models=["H100-80GB"],
        submitted_at=started - timezone.timedelta(minutes=10),
        started_at=started,
        finished_at=started + timezone.timedelta(minutes=30),
        max_runtime_seconds=7200,
    )
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)  # pending
    path = tmp_path / "history.csv"

    call_command("export_jobs_csv", out=str(path), stderr=io.StringIO())

    (job,) = parse_csv(io.StringIO(path.read_text()))
    assert job.job_id == str(done.pk)
    assert (job.num_gpus, job.gpus_per_node, job.duration) == (8, 4, 1800.0)
    assert (job.tenant, job.priority_class, job.pool) == ("nlp", "normal", "training")
    assert (job.gpu_models, job.workload_type, job.runtime_limit) == (
        ("H100-80GB",),
        "training",
        7200.0,
    )
    assert job.submit_time == pytest.approx(done.submitted_at.timestamp(), abs=0.001)


def test_simulate_with_wait_reasons_splits_the_waits_by_size(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text(TRACE)
    out = io.StringIO()

    call_command(
        "simulate",
        trace=str(trace),
        policy="sluice",
        out=tmp_path / "sim",
        workers=1,
        nodes=1,
        wait_reasons=True,
        stdout=out,
    )

    text = out.getvalue()
    assert "Waits by job size" in text
    by_size = json.loads((tmp_path / "sim" / "mine.json").read_text())["policies"][0][
        "wait_by_size"
    ]
    # One 8-GPU node: a (8 GPUs) runs first; b (8 GPUs) waits for it, whatever else does.
    assert set(by_size) == {"1", "2-4", "5-8"}
    assert by_size["5-8"]["jobs"] == 2
    assert by_size["5-8"]["first_wait_h"] > 0
    reasons = by_size["5-8"]["reasons_h"]
    assert sum(reasons.values()) == pytest.approx(by_size["5-8"]["of_average_h"], abs=1e-3)
    assert set(reasons) - {"UNPLANNED", "NOT_REACHED"}, reasons  # an engine reason
    rows = [line.split() for line in text.splitlines() if line.startswith("sluice ")]
    assert [row[1] for row in rows if row[1] in {"1", "2-4", "5-8"}] == ["1", "2-4", "5-8"]
    assert "Waits by priority class" in text
    by_class = json.loads((tmp_path / "sim" / "mine.json").read_text())["policies"][0][
        "wait_by_class"
    ]
    assert sum(figures["jobs"] for figures in by_class.values()) == sum(
        figures["jobs"] for figures in by_size.values()
    )
    for figures in by_class.values():
        assert sum(figures["by_size_h"].values()) == pytest.approx(
            figures["of_average_h"], abs=1e-3
        )
