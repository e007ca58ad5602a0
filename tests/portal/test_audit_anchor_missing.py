"""A missing anchor, and the anchor's copy (``SLUICE_AUDIT_ANCHOR_COPY``).

Deleting the newest events together with the anchor file, or every event with it, must not
verify as intact: a log that has (or had) events needs an anchor, unless a platform admin
accepts the log as it is with ``--reset-anchor REASON``. A copy of the anchor kept elsewhere
is checked too, so the file alone can be neither deleted nor replaced by an older one.
"""

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit import chain as audit_chain
from audit.anchor import Anchor, anchor_read, anchor_write
from audit.apps import _anchor_new_log
from audit.db import highest_id_ever_used
from audit.models import AuditEvent
from audit.services import audit_anchor_new_log, audit_record, audit_verify
from tests.audit_helpers import audit_ids_never_used, tamper


def record(n: int) -> list[AuditEvent]:
    return [
        audit_record(action="test.note", target_type="thing", target_id=i, reason=f"note {i}")
        for i in range(n)
    ]


def verify_fails(match: str) -> str:
    with pytest.raises(CommandError, match=match) as excinfo:
        call_command("audit_verify")
    return str(excinfo.value)


def anchor_file():
    return django_settings.SLUICE_AUDIT_ANCHOR


@pytest.fixture
def log(db):
    events = record(5)
    call_command("audit_verify")
    assert anchor_read().last_id == events[-1].pk
    return events


@pytest.fixture
def copy_path(settings, tmp_path):
    settings.SLUICE_AUDIT_ANCHOR_COPY = str(tmp_path / "elsewhere" / "audit-anchor-copy.json")
    return tmp_path / "elsewhere" / "audit-anchor-copy.json"


# --- the two deletions --------------------------------------------------------------------


def test_deleting_the_newest_events_and_the_anchor_file_is_an_error(log, capsys):
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [log[3].pk])
    anchor_file().unlink()

    message = verify_fails("no anchor for a log of 3 events")

    assert "--reset-anchor REASON" in message
    assert "anchoring at event" not in capsys.readouterr().out
    assert not anchor_file().exists()  # nothing was anchored


def test_deleting_every_event_and_the_anchor_file_is_an_error(log):
    tamper("DELETE FROM audit_auditevent")
    anchor_file().unlink()

    message = verify_fails("the log is empty and has no anchor")

    assert f"event ids up to {log[-1].pk} were used" in message
    assert not anchor_file().exists()


def test_a_log_with_events_and_no_anchor_needs_a_reset_with_a_reason(log, capsys):
    anchor_file().unlink()
    verify_fails("no anchor for a log of 5 events")

    call_command("audit_verify", reset_anchor="anchor volume lost, events checked against backup")

    reset = AuditEvent.objects.get(action="audit.anchor_reset")
    assert reset.reason == "anchor volume lost, events checked against backup"
    assert reset.before == {"anchor": None, "copy": None}
    assert anchor_read().last_id == reset.pk
    assert audit_verify().ok


def test_a_new_empty_log_is_anchored_automatically_and_then_grows(db):
    audit_ids_never_used()
    anchor_file().unlink()
    assert highest_id_ever_used(connection) == 0

    assert audit_verify().ok
    assert anchor_read().count == 0
    events = record(3)

    result = audit_verify()

    assert result.ok, result.problems
    assert (anchor_read().last_id, anchor_read().count) == (events[-1].pk, 3)


def test_migrate_anchors_a_new_empty_log_and_nothing_else(db):
    audit_ids_never_used()
    anchor_file().unlink()

    _anchor_new_log(sender=None, using="default")

    assert anchor_read().count == 0
    # An anchor already there is left alone; so is a log with events.
    assert audit_anchor_new_log() is None
    anchor_file().unlink()
    record(1)
    assert audit_anchor_new_log() is None
    assert anchor_read() is None


# --- the copy ---------------------------------------------------------------------------------


def test_the_copy_is_written_beside_the_file(db, copy_path, capsys):
    events = record(2)

    call_command("audit_verify")

    out = capsys.readouterr().out
    assert f"no anchor copy yet: writing it to {copy_path}" in out
    assert f"(copy: {copy_path})" in out
    assert anchor_read(copy_path) == anchor_read()
    assert anchor_read(copy_path).last_id == events[-1].pk


def test_the_file_deleted_while_the_copy_remains_is_an_error(db, copy_path):
    events = record(5)
    call_command("audit_verify")
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [events[3].pk])
    anchor_file().unlink()

    message = verify_fails("is missing but its copy")

    assert f"event {events[-1].pk} (5 events" in message


def test_an_older_anchor_put_back_in_the_file_is_caught_by_the_copy(db, copy_path):
    record(2)
    call_command("audit_verify")
    old = anchor_file().read_text()
    events = record(3)
    call_command("audit_verify")
    # The newest events deleted and the file replaced by an earlier, validly signed anchor.
    tamper("DELETE FROM audit_auditevent WHERE id >= %s", [events[0].pk])
    anchor_file().write_text(old)

    message = verify_fails("the anchor copy: events deleted after the anchor")

    assert f"event {events[-1].pk} (5 events" in message


def test_a_file_and_a_copy_that_disagree_are_reported(db, copy_path):
    events = record(2)
    call_command("audit_verify")
    head = anchor_read()
    anchor_write(
        Anchor(last_id=head.last_id, count=head.count, hash="f" * 64, verified_at="x"), copy_path
    )

    message = verify_fails("the anchor file and its copy disagree")

    assert f"the anchor copy: the anchored event {events[-1].pk} was replaced" in message


def test_a_copy_this_account_cannot_write_is_a_note_not_a_failure(db, copy_path, monkeypatch):
    record(1)
    call_command("audit_verify")
    record(1)
    # The copy is on storage this account may read but not write (a share mounted read-only
    # here, kept up to date by a run on another host): writing it is refused.
    from audit import services

    def refuse_the_copy(anchor, path=None):
        if path == copy_path:
            raise PermissionError(13, "Permission denied", str(path))
        return anchor_write(anchor, path)

    monkeypatch.setattr(services, "anchor_write", refuse_the_copy)

    result = audit_verify()

    assert result.ok, result.problems
    assert any(f"the anchor copy {copy_path} was not updated" in n for n in result.notes)
    assert (anchor_read().count, anchor_read(copy_path).count) == (2, 1)
    assert audit_verify().ok  # a copy that lags behind the file is fine


def test_an_unreadable_copy_is_an_error(db, settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.SLUICE_AUDIT_ANCHOR_COPY = str(blocker / "audit-anchor-copy.json")
    record(1)

    result = audit_verify()

    assert not result.ok
    assert result.problems[0].startswith("the anchor copy: cannot read the anchor file")


def test_the_genesis_anchor_covers_no_event(db):
    genesis = Anchor.genesis(timezone.now().isoformat())
    assert (genesis.last_id, genesis.count, genesis.hash) == (0, 0, audit_chain.GENESIS_HASH)
