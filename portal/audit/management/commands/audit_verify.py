from django.core.management.base import BaseCommand, CommandError

from portal.audit.services import audit_verify_chain


class Command(BaseCommand):
    help = "Recompute the audit log's hash chain and report the first broken link."

    def handle(self, *args, **options):
        checked, broken, why = audit_verify_chain()
        if broken is not None:
            raise CommandError(
                f"Audit chain broken at event {broken.pk} ({broken.created_at:%Y-%m-%d %H:%M:%S}, "
                f"{broken.action}): {why}. {checked} events read."
            )
        self.stdout.write(self.style.SUCCESS(f"Audit chain intact: {checked} events verified."))
