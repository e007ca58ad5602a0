"""`sluice submit`: flags, spec files (YAML, JSON, lists), arrays; names resolved to ids."""

import json

import pytest

from scheduling.choices import JobState
from scheduling.models import Job
from tests import factories as f


@pytest.fixture
def member_key(world, token_of):
    return token_of(world.member)


def test_submit_with_flags(world, sluice, member_key):
    run = sluice(
        "submit",
        "--queue", "train",
        "--project", "llm",
        "--gpus", "2",
        "--runtime", "2h30m",
        "--name", "bert",
        "--env", "A=1",
        "--env", "B=x=y",
        "--priority-class", "normal",
        "--", "python", "train.py", "--lr", "3e-4",
        token=member_key,
    )  # fmt: skip

    assert run.code == 0, run.err
    job = Job.objects.get()
    assert f"Submitted job {job.pk}" in run.out
    assert job.name == "bert"
    assert job.submitted_by == world.member
    assert job.queue == world.queue and job.project == world.project
    assert job.command == ["python", "train.py", "--lr", "3e-4"]
    assert job.gpus_per_node == 2
    assert job.max_runtime_seconds == 2 * 3600 + 30 * 60
    assert job.env == {"A": "1", "B": "x=y"}
    assert job.workload_type == "training"


def test_the_project_defaults_to_the_tenants_only_one(world, sluice, member_key):
    run = sluice("submit", "-q", "train", "--quiet", "--", "sleep", "1", token=member_key)

    assert run.code == 0, run.err
    job = Job.objects.get()
    assert run.out.strip() == str(job.pk)
    assert job.project == world.project


def test_submit_from_a_yaml_spec_file_flags_override_it(world, sluice, member_key, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-yaml\n"
        "queue: nlp/train\n"
        "project: llm\n"
        "gpus: 4\n"
        "runtime: 1h\n"
        "command: [python, eval.py]\n"
        "env: {SEED: '7'}\n"
        "labels: {team: search}\n"
    )

    run = sluice("submit", "-f", spec, "--name", "overridden", "--json", token=member_key)

    assert run.code == 0, run.err
    data = run.json()
    job = Job.objects.get(pk=data["id"])
    assert data["name"] == job.name == "overridden"
    assert job.gpus_per_node == 4
    assert job.max_runtime_seconds == 3600
    assert job.command == ["python", "eval.py"]
    assert job.env == {"SEED": "7"} and job.labels == {"team": "search"}


def test_submit_from_a_json_file_as_an_array(world, sluice, member_key, tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(
        json.dumps(
            {
                "queue": world.queue.pk,
                "project": world.project.pk,
                "workload_type": "evaluation",
                "command": "python sweep.py",
                "gpus_per_node": 1,
            }
        )
    )

    run = sluice("submit", "-f", spec, "--array", "3", token=member_key)

    assert run.code == 0, run.err
    jobs = list(Job.objects.order_by("array_index"))
    assert [j.array_index for j in jobs] == [0, 1, 2]
    assert len({j.array_id for j in jobs}) == 1
    assert all(j.command == ["python", "sweep.py"] for j in jobs)
    assert all(j.workload_type == "evaluation" for j in jobs)
    assert f"array {jobs[0].array_id} of 3 jobs" in run.out
    assert f"{jobs[0].pk}-{jobs[2].pk}" in run.out


def test_a_list_of_specs_is_submitted_all_or_nothing(world, sluice, member_key, tmp_path):
    spec = tmp_path / "jobs.yaml"
    spec.write_text(
        "- {queue: train, command: [python, a.py]}\n- {queue: train, command: [python, b.py]}\n"
    )
    ok = sluice("submit", "-f", spec, token=member_key)
    assert ok.code == 0, ok.err
    assert sorted(Job.objects.values_list("command", flat=True)) == [
        ["python", "a.py"],
        ["python", "b.py"],
    ]

    spec.write_text(
        "- {queue: train, command: [python, c.py]}\n"
        "- {queue: train, command: [python, d.py], gpus: 9}\n"
    )
    refused = sluice("submit", "-f", spec, token=member_key)
    assert refused.code == 1
    assert "error: jobs[1].gpus_per_node:" in refused.err
    assert Job.objects.count() == 2


def test_an_unknown_field_in_a_spec_file_is_a_usage_error(world, sluice, member_key, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("queue: train\ncommand: [python, a.py]\ngpu: 2\n")

    run = sluice("submit", "-f", spec, token=member_key)

    assert run.code == 2
    assert "unknown field 'gpu'" in run.err
    assert not Job.objects.exists()


def test_a_job_submitted_is_placed_and_shown_with_its_allocations(world, sluice, member_key):
    """Eager dispatch in the test settings: the job is placed at once."""
    job_id = sluice("submit", "-q", "train", "-g", "2", "--quiet", "--", "x", token=member_key)
    assert job_id.code == 0, job_id.err

    run = sluice("show", job_id.out.strip(), token=member_key)

    assert run.code == 0, run.err
    job = Job.objects.get()
    assert job.state == JobState.ADMITTED
    assert "State          ADMITTED" in run.out
    node = job.allocations.first().node.name
    indexes = ",".join(str(a.gpu.index) for a in job.allocations.order_by("gpu__index"))
    assert f"Allocations    {node}: GPU {indexes}" in run.out


def test_the_project_defaults_to_that_of_my_latest_job_in_the_queue(world, sluice, member_key):
    """A tenant of several projects (the demo's nlp has three): the project of your latest
    job in the queue, said on stderr, instead of refusing to submit."""
    other = f.ProjectFactory(tenant=world.tenant, slug="chat")
    f.ProjectFactory(tenant=world.tenant, slug="eval")
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    f.JobFactory(queue=world.queue, project=other, submitted_by=world.member)
    # Someone else's later job does not count.
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)

    run = sluice("submit", "-q", "train", "--quiet", "--", "sleep", "1", token=member_key)

    assert run.code == 0, run.err
    job = Job.objects.get(pk=int(run.out))
    assert job.project == other
    assert "project chat, as your latest job in nlp/train (--project to choose)" in run.err


def test_without_a_job_to_go_by_the_usage_error_lists_the_projects(world, sluice, member_key):
    f.ProjectFactory(tenant=world.tenant, slug="chat")
    f.ProjectFactory(tenant=world.tenant, slug="old", active=False)

    run = sluice("submit", "-q", "train", "--", "sleep", "1", token=member_key)

    assert run.code == 2
    assert "--project NAME (projects of nlp: chat, llm)" in run.err
    assert not Job.objects.exists()
