"""``audit_verify`` against a forger who can write the database but does not hold the audit key.

Three defences, each tested here: the keyed hash (a chain rewritten with the app's plain hash,
or with a guessed key, fails), the anchor file outside the database (the newest events deleted
fail), and the seal over events written before the keyed hash (they still verify, and cannot be
rewritten either).
"""

import hashlib
import hmac
import importlib
import json
import logging
import os
from types import SimpleNamespace

import pytest
from django.apps import apps as django_apps
from django.conf import settings as django_settings
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit import chain as audit_chain
from audit.anchor import anchor_read
from audit.models import AuditEvent
from audit.services import audit_last_verification, audit_record, audit_verify_chain
from audit.tasks import verify as verify_task
from tests.audit_helpers import append_only_guard_dropped, audit_ids_never_used, tamper

seal_migration = importlib.import_module("audit.migrations.0004_seal_plain_chain")


def record(n: int) -> list[AuditEvent]:
    return [
        audit_record(action="test.note", target_type="thing", target_id=i, reason=f"note {i}")
        for i in range(n)
    ]


def write_plain(n: int) -> list[AuditEvent]:
    """Events as the app wrote them before the keyed hash: plain SHA-256, version 1."""
    prev = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first()
    events = []
    for i in range(n):
        event = AuditEvent(
            created_at=timezone.now(),
            actor_label="system",
            action="legacy.note",
            target_type="thing",
            target_id=str(i),
            after={"i": i},
            prev_hash=prev or audit_chain.GENESIS_HASH,
            hash_version=audit_chain.PLAIN,
        )
        event.hash = hashlib.sha256(event.canonical_payload().encode()).hexdigest()
        event.save()
        prev = event.hash
        events.append(event)
    return events


def seal() -> None:
    """What migration 0004 does on a database that has plain events."""
    seal_migration.seal(django_apps, SimpleNamespace(connection=connection))


def rewrite_chain(*, version: int, change=None) -> None:
    """The forger's rewrite: every event re-hashed with the app's own functions and relinked."""
    prev = audit_chain.GENESIS_HASH
    with append_only_guard_dropped(), connection.cursor() as cursor:
        for event in AuditEvent.objects.order_by("id"):
            if change:
                change(event)
            event.prev_hash, event.hash_version = prev, version
            event.hash = event.compute_hash()
            cursor.execute(
                "UPDATE audit_auditevent SET reason = %s, prev_hash = %s, hash = %s, "
                "hash_version = %s WHERE id = %s",
                [event.reason, event.prev_hash, event.hash, event.hash_version, event.pk],
            )
            prev = event.hash


def forge_reason(event) -> None:
    if event.reason == "note 1":
        event.reason = "nothing to see"


def verify_fails(match: str) -> str:
    with pytest.raises(CommandError, match=match) as excinfo:
        call_command("audit_verify")
    return str(excinfo.value)


@pytest.fixture
def log(db):
    return record(5)


# --- an untouched chain ---------------------------------------------------------------------


def test_an_untouched_chain_verifies_and_its_head_is_anchored(log, capsys):
    call_command("audit_verify")

    out = capsys.readouterr().out
    assert "Audit chain intact: 5 events verified." in out
    assert f"Anchor: event {log[-1].pk} (5 events" in out
    anchor = anchor_read()
    assert (anchor.last_id, anchor.count, anchor.hash) == (log[-1].pk, 5, log[-1].hash)
    path = django_settings.SLUICE_AUDIT_ANCHOR
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_the_anchor_follows_the_log_as_it_grows(log):
    call_command("audit_verify")
    more = record(2)

    call_command("audit_verify")

    anchor = anchor_read()
    assert (anchor.last_id, anchor.count) == (more[-1].pk, 7)


def test_new_events_carry_an_hmac_with_the_audit_key_not_a_plain_sha256(log):
    event = AuditEvent.objects.get(pk=log[0].pk)
    payload = event.canonical_payload().encode()

    assert event.hash_version == audit_chain.KEYED
    assert event.hash != hashlib.sha256(payload).hexdigest()
    assert event.hash == hmac.new(audit_chain.audit_key(), payload, hashlib.sha256).hexdigest()
    assert '"hash_version":2' in event.canonical_payload()


def test_the_key_is_the_setting_when_set_else_derived_from_secret_key(settings):
    settings.SLUICE_AUDIT_KEY = ""
    derived = audit_chain.audit_key()
    settings.SECRET_KEY = "another-secret-key-for-this-test-only-0123456789"
    assert audit_chain.audit_key() != derived
    settings.SLUICE_AUDIT_KEY = "k" * 40
    assert audit_chain.audit_key() == b"k" * 40


def test_no_anchor_update_leaves_the_anchor_where_it_was(log):
    call_command("audit_verify")
    record(2)

    call_command("audit_verify", no_anchor_update=True)

    assert anchor_read().last_id == log[-1].pk


def test_a_new_empty_log_verifies_and_is_anchored_at_its_start(db, capsys):
    audit_ids_never_used()
    django_settings.SLUICE_AUDIT_ANCHOR.unlink()

    call_command("audit_verify")

    out = capsys.readouterr().out
    assert "0 events verified" in out
    assert "a new, empty log: anchored at its start" in out
    assert (anchor_read().last_id, anchor_read().count) == (0, 0)


# --- events deleted: found by the anchor ----------------------------------------------------


def test_deleting_the_newest_events_is_detected_by_the_anchor(log):
    call_command("audit_verify")
    before = django_settings.SLUICE_AUDIT_ANCHOR.read_text()
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [log[3].pk])

    # What is left is a valid chain: the chain alone cannot tell.
    assert audit_verify_chain() == (3, None, "")
    message = verify_fails("events deleted after the anchor")

    assert f"the log now ends at event {log[2].pk} (3 events)" in message
    assert f"event {log[-1].pk} (5 events" in message
    assert django_settings.SLUICE_AUDIT_ANCHOR.read_text() == before  # the anchor stays


def test_deleting_the_newest_events_and_writing_new_ones_is_detected(log):
    call_command("audit_verify")
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [log[3].pk])
    record(3)  # the app goes on writing: the chain is valid again, and longer than before

    assert audit_verify_chain()[1] is None
    verify_fails(f"the anchored event {log[-1].pk} is gone")


def test_deleting_every_event_is_detected(log):
    call_command("audit_verify")
    tamper("DELETE FROM audit_auditevent")

    verify_fails(r"events deleted after the anchor: the log now ends at nothing \(0 events\)")


def test_an_anchor_file_edited_by_hand_is_refused(log):
    call_command("audit_verify")
    path = django_settings.SLUICE_AUDIT_ANCHOR
    stored = json.loads(path.read_text())
    stored["anchor"]["count"] = 3
    path.write_text(json.dumps(stored))

    verify_fails("does not carry a valid signature")
    assert json.loads(path.read_text())["anchor"]["count"] == 3  # not overwritten


def test_reset_anchor_accepts_the_log_as_it_is_and_says_so_in_the_log(log, capsys):
    call_command("audit_verify")
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [log[3].pk])
    verify_fails("events deleted after the anchor")

    call_command("audit_verify", reset_anchor="restored from backup, ticket 42")

    reset = AuditEvent.objects.get(action="audit.anchor_reset")
    assert reset.reason == "restored from backup, ticket 42"
    assert reset.before["anchor"]["last_id"] == log[-1].pk
    assert anchor_read().last_id == reset.pk
    assert "anchor reset" in capsys.readouterr().out
    call_command("audit_verify")


# --- the chain rewritten by someone without the key ------------------------------------------


def test_a_chain_rewritten_with_the_plain_hash_is_detected_without_an_anchor(log):
    rewrite_chain(version=audit_chain.PLAIN, change=forge_reason)

    # Every link and every plain hash is right: only the missing key gives it away.
    assert all(e.compute_hash() == e.hash for e in AuditEvent.objects.all())
    verify_fails("plain-hash events that no keyed event seals")


def test_a_chain_rewritten_with_the_plain_hash_is_detected_by_the_anchor_too(log):
    call_command("audit_verify")
    rewrite_chain(version=audit_chain.PLAIN, change=forge_reason)

    message = verify_fails(f"the anchored event {log[-1].pk} was replaced")
    assert "no keyed event seals" in message


def test_a_chain_rewritten_with_a_guessed_key_is_detected(log, settings):
    real_key = settings.SLUICE_AUDIT_KEY
    settings.SLUICE_AUDIT_KEY = "guessed-key"
    rewrite_chain(version=audit_chain.KEYED, change=forge_reason)
    settings.SLUICE_AUDIT_KEY = real_key

    message = verify_fails(f"broken at event {log[0].pk}")
    assert "hashed without the server's audit key" in message


def test_a_forged_plain_event_appended_after_keyed_ones_is_detected(log):
    """INSERT stays allowed (the log is append-only): a forged event must still fail."""
    forged = write_plain(1)[0]

    message = verify_fails(f"broken at event {forged.pk}")
    assert "plain-hash event after keyed ones" in message


# --- events from before the keyed hash -------------------------------------------------------


def test_plain_events_sealed_by_the_migration_still_verify(db, capsys):
    plain = write_plain(3)
    seal()
    keyed = record(1)

    call_command("audit_verify")

    assert "Audit chain intact: 5 events verified." in capsys.readouterr().out
    sealed = AuditEvent.objects.get(action="audit.chain_sealed")
    assert sealed.hash_version == audit_chain.KEYED
    assert sealed.prev_hash == plain[-1].hash
    assert sealed.after == {"plain_events": 3, "last_plain_id": plain[-1].pk}
    assert keyed[0].prev_hash == sealed.hash


def test_the_seal_is_written_once_and_never_on_a_keyed_or_empty_log(db):
    seal()
    assert AuditEvent.objects.count() == 0
    write_plain(2)
    seal()
    seal()
    assert AuditEvent.objects.filter(action="audit.chain_sealed").count() == 1
    record(1)
    seal()
    assert AuditEvent.objects.filter(action="audit.chain_sealed").count() == 1


def test_unsealed_plain_events_fail(db):
    plain = write_plain(3)

    message = verify_fails(f"broken at event {plain[-1].pk}")
    assert "no keyed event seals" in message


def test_sealed_plain_events_rewritten_with_plain_hashes_break_the_seal(db):
    plain = write_plain(3)
    seal()
    sealed = AuditEvent.objects.get(action="audit.chain_sealed")
    prev = audit_chain.GENESIS_HASH
    with append_only_guard_dropped(), connection.cursor() as cursor:
        for event in AuditEvent.objects.filter(pk__in=[p.pk for p in plain]).order_by("id"):
            event.after = {"i": "forged"}
            event.prev_hash = prev
            event.hash = event.compute_hash()
            cursor.execute(
                "UPDATE audit_auditevent SET after = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [json.dumps(event.after), event.prev_hash, event.hash, event.pk],
            )
            prev = event.hash

    message = verify_fails(f"broken at event {sealed.pk}")
    assert "prev_hash does not match" in message


# --- the periodic task and the audit page ----------------------------------------------------


def test_the_beat_schedule_runs_the_verification_task():
    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-verify"]

    assert entry["task"] == verify_task.name == "audit.verify"


def test_the_task_records_the_outcome_and_the_audit_page_shows_it(world, caplog):
    cache.clear()
    admin = Client()
    admin.force_login(world.platform_admin)
    tenant_admin = Client()
    tenant_admin.force_login(world.tenant_admin)
    assert "Not verified yet" in admin.get("/audit/").content.decode()

    events = record(3)
    verify_task.delay()

    assert audit_last_verification()["ok"] is True
    page = admin.get("/audit/").content.decode()
    assert "Chain intact" in page
    assert f"anchored at event {events[-1].pk}" in page
    assert 'id="audit-verification"' not in tenant_admin.get("/audit/").content.decode()

    tamper("DELETE FROM audit_auditevent WHERE id = %s", [events[-1].pk])
    with caplog.at_level(logging.ERROR, logger="audit.tasks"):
        verify_task.delay()

    last = audit_last_verification()
    assert last["ok"] is False
    assert any("events deleted after the anchor" in p for p in last["problems"])
    assert "AUDIT LOG VERIFICATION FAILED" in caplog.text
    page = admin.get("/audit/").content.decode()
    assert "Verification failed" in page
    assert "events deleted after the anchor" in page
