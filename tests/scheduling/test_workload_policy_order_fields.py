"""A workload policy's max wait, preemption limit and protection: validated with
field errors (never a 500) through the API and the Django admin, audited, shown on the
pages that show policies; platform admins only."""

import pytest
from django.forms.models import model_to_dict

from audit.models import AuditEvent
from scheduling.models import WorkloadPolicy
from tests import factories as f

URL = "/api/v1/workload-policies/training"
FIELDS = ("max_wait_seconds", "max_preemptions", "preemption_protection_seconds")


def _stored():
    return WorkloadPolicy.objects.values_list(*FIELDS).get(workload_type="training")


def test_new_policies_get_the_defaults(world, api):
    body = api(world.member).get(URL).json()

    assert {k: body[k] for k in FIELDS} == {
        "max_wait_seconds": 48 * 3600,
        "max_preemptions": 3,
        "preemption_protection_seconds": 0,
    }


def test_platform_admin_sets_them_and_the_change_is_audited(world, api):
    response = api(world.platform_admin).patch(
        URL,
        {"max_wait_seconds": 3600, "max_preemptions": 0, "preemption_protection_seconds": 7200},
        format="json",
    )

    assert response.status_code == 200, response.json()
    assert _stored() == (3600, 0, 7200)
    audit = AuditEvent.objects.get(action="policy.update")
    assert audit.actor == world.platform_admin
    assert (audit.before["max_wait_seconds"], audit.after["max_wait_seconds"]) == (172800, 3600)
    assert (audit.before["max_preemptions"], audit.after["max_preemptions"]) == (3, 0)
    assert audit.after["preemption_protection_seconds"] == 7200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_wait_seconds", 0),
        ("max_wait_seconds", 59),
        ("max_wait_seconds", -1),
        ("max_wait_seconds", 367 * 86400),
        ("max_wait_seconds", 2**40),
        ("max_wait_seconds", "soon"),
        ("max_wait_seconds", None),
        ("max_preemptions", -1),
        ("max_preemptions", 1001),
        ("max_preemptions", 1.5),
        ("max_preemptions", [3]),
        ("preemption_protection_seconds", -60),
        ("preemption_protection_seconds", 10**12),
        ("preemption_protection_seconds", "forever"),
    ],
)
def test_bad_values_are_a_400_naming_the_field_and_store_nothing(world, api, field, value):
    before, audits = _stored(), AuditEvent.objects.count()

    response = api(world.platform_admin).patch(URL, {field: value}, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["errors"] and body["errors"][field], body
    assert _stored() == before and AuditEvent.objects.count() == audits


def test_create_with_bad_values_is_a_400_too(world, api):
    WorkloadPolicy.objects.filter(workload_type="evaluation").delete()

    response = api(world.platform_admin).post(
        "/api/v1/workload-policies",
        {"workload_type": "evaluation", "max_wait_seconds": 10, "max_preemptions": -2},
        format="json",
    )

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"max_wait_seconds", "max_preemptions"}
    assert not WorkloadPolicy.objects.filter(workload_type="evaluation").exists()


@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer", "outsider"])
def test_only_platform_admins_change_them(world, api, who):
    response = api(getattr(world, who)).patch(URL, {"max_preemptions": 9}, format="json")

    assert response.status_code == 403
    assert _stored() == (172800, 3, 0)


def _admin_form(policy, **changes) -> dict:
    data = {k: v for k, v in model_to_dict(policy).items() if v is not None}
    data.pop("allowed_pools", None)
    return {**data, **changes, "_save": "Save"}


def test_the_django_admin_refuses_bad_values_with_field_errors(world, client):
    client.force_login(world.platform_admin)
    policy = WorkloadPolicy.objects.get(workload_type="training")
    url = f"/admin/scheduling/workloadpolicy/{policy.pk}/change/"

    response = client.post(
        url, _admin_form(policy, max_wait_seconds=5, preemption_protection_seconds=-1)
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"max_wait_seconds", "preemption_protection_seconds"}
    assert _stored() == (172800, 3, 0) and not AuditEvent.objects.exists()

    response = client.post(url, _admin_form(policy, max_wait_seconds=1800, max_preemptions=1))

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert _stored() == (1800, 1, 0)
    audit = AuditEvent.objects.get(action="workloadpolicy.update")
    assert (audit.before["max_wait_seconds"], audit.after["max_wait_seconds"]) == (172800, 1800)


def test_the_submit_page_shows_them_per_workload_type(world, client):
    f.policy("interactive", max_wait_seconds=900, max_preemptions=1)
    f.policy("inference", max_preemptions=0)
    client.force_login(world.member)

    page = client.get("/jobs/new/").content.decode()

    assert "Max wait" in page and "<td>15m</td>" in page and "<td>2d</td>" in page
    assert "at most 1, then protected for the run" in page
    assert "<td>no limit</td>" in page
