"""Seal the events hashed the plain way with one keyed event, so they cannot be rewritten.

The seal chains onto the last plain event; its HMAC covers that event's hash, so changing any
plain event (and recomputing the plain hashes after it) breaks the seal's link, and nobody
without the audit key can write a new seal. Nothing is written on an empty log.
"""

from django.db import migrations
from django.utils import timezone

from audit import chain


def seal(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    db = schema_editor.connection.alias
    events = AuditEvent.objects.using(db)
    last = events.order_by("-id").first()
    if last is None or last.hash_version != chain.PLAIN:
        return
    plain = events.filter(hash_version=chain.PLAIN).count()
    event = AuditEvent(
        created_at=timezone.now(),
        actor=None,
        actor_label="system",
        action="audit.chain_sealed",
        target_type="audit.auditevent",
        target_id=str(last.pk),
        target_label=f"{plain} events hashed without the audit key",
        tenant=None,
        before=None,
        after={"plain_events": plain, "last_plain_id": last.pk},
        reason=(
            "Events up to this one carry a plain SHA-256 hash; from here on each hash is an HMAC "
            "keyed with the server's audit key, and this event's HMAC seals the earlier ones."
        ),
        source_address=None,
        request_id="",
        prev_hash=last.hash,
        hash_version=chain.KEYED,
    )
    event.hash = chain.event_hash(event)
    event.save(using=db)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_auditevent_hash_version")]
    # The seal stays when migrating back: the log is append-only.
    operations = [migrations.RunPython(seal, migrations.RunPython.noop)]
