"""What a job may ask of the node it runs on, checked at submission.

Reserved environment names, directories outside the job's own, and users who map to no Unix
account are refused with a 400 naming the field, before anything is stored.
"""

import pytest

from scheduling.agent.protocol import RESERVED_ENV_NAMES
from scheduling.models import Job
from tenants.selectors import job_unix_account
from tests import factories as f

from .test_job_submit import URL, body, nothing_stored, refused  # noqa: F401 (fixture)


@pytest.mark.parametrize("name", sorted(RESERVED_ENV_NAMES) + ["SLUICE_TOKEN"])
def test_reserved_environment_names_are_refused(api, world, nothing_stored, name):  # noqa: F811
    data = refused(api, world.member, body(world, env={"OK": "1", name: "x"}))

    assert name in data["errors"]["env"][0]
    assert "set by Sluice" in data["errors"]["env"][0]


def test_ordinary_environment_names_are_kept(api, world):
    env = {"PYTHONPATH": "/opt/lib", "HF_HOME": "cache", "NCCL_DEBUG": "INFO"}
    response = api(world.member).post(URL, body(world, env=env), format="json")

    assert response.status_code == 201, response.content
    assert Job.objects.get().env == env


@pytest.mark.parametrize("field", ["working_dir", "checkpoint_dir"])
@pytest.mark.parametrize("value", ["/", "/tmp/attack", "../../../..", "out/../../x", "/etc"])
def test_directories_outside_the_job_directory_are_refused(
    api,
    world,
    nothing_stored,  # noqa: F811
    field,
    value,
):
    data = refused(api, world.member, body(world, **{field: value}))

    assert field in data["errors"]


@pytest.mark.parametrize(
    ("value", "stored"), [("src", "src"), ("./runs/a", "runs/a"), ("ckpt/", "ckpt")]
)
def test_relative_directories_inside_the_job_directory_are_kept(api, world, value, stored):
    response = api(world.member).post(
        URL, body(world, working_dir=value, checkpoint_dir=value), format="json"
    )

    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.working_dir, job.checkpoint_dir) == (stored, stored)


def test_absolute_directories_under_the_tenants_root_are_allowed(api, world, settings):
    settings.SLUICE_JOB_PATH_ROOTS = ["/data/{tenant}"]

    ok = api(world.member).post(URL, body(world, checkpoint_dir="/data/nlp/ckpt"), format="json")
    other = api(world.member).post(URL, body(world, checkpoint_dir="/data/vision"), format="json")

    assert ok.status_code == 201, ok.content
    assert other.status_code == 400
    assert "/data/nlp" in other.json()["errors"]["checkpoint_dir"][0]
    assert Job.objects.count() == 1


def test_a_user_with_no_valid_unix_account_is_refused_when_accounts_are_per_user(
    api,
    world,
    settings,
    nothing_stored,  # noqa: F811
):
    settings.SLUICE_JOB_ACCOUNT = "{user}"
    user = f.UserFactory(username="Jane.Doe@example.com")
    f.MembershipFactory(user=user, tenant=world.tenant, role="member")

    data = refused(api, user, body(world))

    assert "Unix account" in data["errors"]["project"][0]


def test_accounts_default_to_the_tenant_and_follow_its_override(world, settings):
    assert job_unix_account(tenant=world.tenant, username="x") == "sluice-nlp"
    settings.SLUICE_JOB_ACCOUNT = "{user}"
    assert job_unix_account(tenant=world.tenant, username="alice") == "alice"
    world.tenant.unix_account = "nlpjobs"
    assert job_unix_account(tenant=world.tenant, username="alice") == "nlpjobs"


def test_long_tenant_slugs_map_to_distinct_valid_accounts(db):
    a = f.TenantFactory(slug="natural-language-processing-research-group-east")
    b = f.TenantFactory(slug="natural-language-processing-research-group-west")

    name_a = job_unix_account(tenant=a, username="")
    name_b = job_unix_account(tenant=b, username="")

    assert name_a != name_b
    assert len(name_a) <= 32 and len(name_b) <= 32
    assert name_a.startswith("sluice-natural")


@pytest.mark.parametrize(
    "overrides",
    [
        {"command": ["python3", "x\ud800"]},
        {"env": {"A": "\udfff"}},
        {"parameters": {"lr": "\ud800"}},
        {"labels": {"\ud800": "x"}},
    ],
)
def test_the_service_refuses_lone_surrogates_whoever_calls_it(world, overrides):
    from portal.errors import BusinessError
    from scheduling.services.jobs import JobSpec, job_submit

    values = {
        "queue": world.queue,
        "project": world.project,
        "name": "",
        "workload_type": "training",
        "command": ["python3", "train.py"],
        **overrides,
    }
    with pytest.raises(BusinessError) as refused:
        job_submit(user=world.member, spec=JobSpec(**values))

    assert list(refused.value.errors) == [next(iter(overrides))]
    assert not Job.objects.exists()
