"""The audit log page ``/audit/`` and its CSV export ``/audit/export.csv``."""

import csv
import io

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.services import audit_record
from scheduling.models import Quota
from scheduling.services import config
from tenants import services as tenant_services
from tenants.models import Membership


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def events(world):
    viewer = Membership.objects.get(user=world.viewer, tenant=world.tenant)
    tenant_services.membership_change_role(
        actor=world.tenant_admin, membership=viewer, role="member"
    )
    config.quota_save(
        actor=world.platform_admin, quota=Quota.objects.get(tenant=world.other), guaranteed_gpus=4
    )
    audit_record(
        action="test.note",
        target_type="thing",
        target_id=1,
        tenant=world.tenant,
        reason='=HYPERLINK("http://evil")',
    )
    return list(AuditEvent.objects.order_by("id"))


def rows_of(response) -> list[list[str]]:
    assert response.streaming
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_tenant_admin_sees_their_tenants_events(world, events):
    response = client_for(world.tenant_admin).get("/audit/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "membership.change_role" in page
    assert "test.note" in page
    assert "quota.update" not in page  # vision's


def test_platform_admin_sees_all_and_filters_with_the_form(world, events):
    client = client_for(world.platform_admin)

    everything = client.get("/audit/").content.decode()
    filtered = client.get("/audit/", {"action": "quota.update", "actor": "root"}).content.decode()

    assert "membership.change_role" in everything and "quota.update" in everything
    assert "quota.update" in filtered
    assert "membership.change_role" not in filtered
    assert 'value="quota.update"' in filtered  # the form keeps the filter


def test_bad_time_shows_a_field_error(world, events):
    response = client_for(world.platform_admin).get("/audit/", {"since": "soon"})

    assert response.status_code == 200
    assert "Give a date (2026-12-02)" in response.content.decode()


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_get_403(world, events, who):
    user = getattr(world, who)
    assert client_for(user).get("/audit/").status_code == 403
    assert client_for(user).get("/audit/export.csv").status_code == 403


def test_anonymous_is_sent_to_login(world, events):
    response = Client().get("/audit/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_pages_of_fifty(world, events):
    for n in range(60):
        audit_record(action="test.bulk", target_type="thing", target_id=n, tenant=world.tenant)
    client = client_for(world.tenant_admin)

    first = client.get("/audit/", {"action": "test.bulk"}).content.decode()
    second = client.get("/audit/", {"action": "test.bulk", "page": 2}).content.decode()

    assert "page 1 of 2 · 60 events" in first
    assert "action=test.bulk&page=2" in first
    assert "page 2 of 2" in second


def test_csv_export_streams_the_filtered_events(world, events):
    response = client_for(world.platform_admin).get("/audit/export.csv", {"tenant": "nlp"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="sluice-audit-')
    rows = rows_of(response)
    header, body = rows[0], rows[1:]
    assert header[:4] == ["id", "created_at", "actor", "action"]
    assert [r[3] for r in body] == ["test.note", "membership.change_role"]
    change = dict(zip(header, body[1], strict=True))
    assert change["actor"] == "nlp-admin"
    assert change["tenant"] == "nlp"
    assert change["before"] == '{"role": "viewer", "user": "nlp-viewer"}'
    assert change["hash"] == events[0].hash


def test_csv_cells_cannot_run_as_formulas(world, events):
    rows = rows_of(client_for(world.tenant_admin).get("/audit/export.csv", {"action": "test.note"}))

    reason = dict(zip(rows[0], rows[1], strict=True))["reason"]
    assert reason == '\'=HYPERLINK("http://evil")'


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r", "\n"])
def test_every_formula_start_is_defused_as_in_every_export(world, start):
    """The audit log's export defuses the same cells as the usage report's (one list)."""
    audit_record(
        action="test.note",
        target_type="thing",
        target_id=1,
        tenant=world.tenant,
        reason=start + "1",
    )
    rows = rows_of(client_for(world.tenant_admin).get("/audit/export.csv", {"action": "test.note"}))

    assert dict(zip(rows[0], rows[1], strict=True))["reason"] == "'" + start + "1"


def test_the_export_and_the_api_show_the_same_columns_in_the_same_order(world, events):
    client = client_for(world.tenant_admin)
    header = rows_of(client.get("/audit/export.csv"))[0]
    api_event = client.get("/api/v1/audit-events/").json()["results"][0]

    assert list(api_event) == header


def test_csv_export_is_scoped_like_the_page(world, events):
    rows = rows_of(client_for(world.tenant_admin).get("/audit/export.csv"))

    assert sorted(r[3] for r in rows[1:]) == ["membership.change_role", "test.note"]


def test_nav_links_for_admins_only(world, events):
    admin_page = client_for(world.tenant_admin).get("/").content.decode()
    member_page = client_for(world.member).get("/").content.decode()
    root_page = client_for(world.platform_admin).get("/").content.decode()

    for page in (admin_page, root_page):
        assert 'href="/audit/"' in page and 'href="/approvals/"' in page
    assert 'href="/audit/"' not in member_page
    assert 'href="/approvals/"' not in member_page
    assert 'href="/notifications/"' in member_page
