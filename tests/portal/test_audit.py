"""The audit log is append-only and hash-chained; tampering is detected or refused.

The database refuses UPDATE and DELETE (triggers on PostgreSQL and SQLite); the tampering
tests play an attacker who can write the database and removes that guard first.
"""

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, models, transaction

from audit import chain as audit_chain
from audit.db import append_only_guard_ensure, append_only_guard_missing
from audit.models import AppendOnlyError, AuditEvent
from audit.services import GENESIS_HASH, audit_record, audit_verify_chain
from tenants import services as tenant_services
from tests import factories as f
from tests.audit_helpers import append_only_guard_dropped, tamper


@pytest.fixture
def chain(db):
    """Three events written by real services."""
    admin = f.UserFactory(username="root", is_staff=True)
    tenant = tenant_services.tenant_create(actor=admin, slug="nlp", name="Language")
    tenant_services.tenant_update(actor=admin, tenant=tenant, name="Language models")
    audit_record(action="test.note", target_type="thing", target_id=7, actor=admin, reason="why")
    return list(AuditEvent.objects.order_by("id"))


def test_events_are_chained_by_hash(chain):
    assert [e.action for e in chain] == ["tenant.create", "tenant.update", "test.note"]
    assert chain[0].prev_hash == GENESIS_HASH
    assert chain[1].prev_hash == chain[0].hash
    assert chain[2].prev_hash == chain[1].hash
    assert all(e.hash == e.compute_hash() for e in chain)
    assert {e.hash_version for e in chain} == {audit_chain.KEYED}
    assert chain[1].before["name"] == "Language"
    assert chain[1].after["name"] == "Language models"
    assert chain[2].actor_label == "root"


def test_audit_verify_passes_on_a_clean_chain(chain, capsys):
    call_command("audit_verify")

    assert "Audit chain intact: 3 events verified." in capsys.readouterr().out


def test_audit_verify_passes_on_an_empty_log(db, capsys):
    call_command("audit_verify")

    assert "0 events verified" in capsys.readouterr().out


def test_raw_sql_change_of_a_row_is_detected(chain):
    victim = chain[1]
    tamper("UPDATE audit_auditevent SET reason = %s WHERE id = %s", ["nothing happened", victim.pk])

    with pytest.raises(CommandError) as excinfo:
        call_command("audit_verify")

    assert f"event {victim.pk}" in str(excinfo.value)
    assert "tenant.update" in str(excinfo.value)
    assert "changed after it was written" in str(excinfo.value)


def test_raw_sql_delete_of_a_row_is_detected(chain):
    tamper("DELETE FROM audit_auditevent WHERE id = %s", [chain[1].pk])

    checked, broken, why = audit_verify_chain()

    assert broken is not None and broken.pk == chain[2].pk
    assert "deleted or reordered" in why
    with pytest.raises(CommandError, match=f"event {chain[2].pk}"):
        call_command("audit_verify")


def test_rewriting_a_row_with_a_fresh_hash_still_breaks_the_chain(chain):
    """A forger who recomputes the changed row's hash breaks the next row's link instead."""
    victim = chain[0]
    victim.reason = "forged"
    new_hash = victim.compute_hash()
    tamper(
        "UPDATE audit_auditevent SET reason = %s, hash = %s WHERE id = %s",
        ["forged", new_hash, victim.pk],
    )

    _, broken, why = audit_verify_chain()

    assert broken.pk == chain[1].pk
    assert "prev_hash" in why


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_auditevent SET reason = 'x' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
    ],
)
def test_database_trigger_rejects_raw_update_and_delete(chain, sql):
    """PostgreSQL and SQLite alike: the database itself refuses, and nothing changes."""
    victim = chain[0]
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [victim.pk])

    stored = AuditEvent.objects.get(pk=victim.pk)
    assert stored.reason == victim.reason
    assert stored.hash == victim.hash
    assert AuditEvent.objects.count() == 3
    call_command("audit_verify")


def test_database_trigger_rejects_orm_update_and_delete_that_skip_the_model(chain):
    """A plain QuerySet (not the model's append-only one) still meets the trigger."""
    plain = models.QuerySet(model=AuditEvent)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        plain.filter(pk=chain[0].pk).update(reason="changed")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        plain.filter(pk=chain[2].pk).delete()

    assert AuditEvent.objects.count() == 3
    assert AuditEvent.objects.get(pk=chain[0].pk).reason == ""


def test_the_guard_is_reported_missing_and_put_back_by_migrate(chain):
    assert append_only_guard_missing(connection) == []
    with append_only_guard_dropped():
        assert append_only_guard_missing(connection) != []
        with pytest.raises(CommandError, match="append-only guard is missing"):
            call_command("audit_verify")
        append_only_guard_ensure(connection)  # what post_migrate does
        assert append_only_guard_missing(connection) == []
    assert append_only_guard_missing(connection) == []


def test_saving_an_existing_event_raises(chain):
    event = AuditEvent.objects.get(pk=chain[0].pk)
    event.reason = "changed"

    with pytest.raises(AppendOnlyError):
        event.save()

    assert AuditEvent.objects.get(pk=event.pk).reason == ""


def test_deleting_an_event_raises(chain):
    with pytest.raises(AppendOnlyError):
        chain[0].delete()
    assert AuditEvent.objects.count() == 3


def test_queryset_update_and_delete_raise(chain):
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=chain[0].pk).update(reason="changed")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.update(reason="changed")

    assert AuditEvent.objects.count() == 3
    assert AuditEvent.objects.get(pk=chain[0].pk).reason == ""
