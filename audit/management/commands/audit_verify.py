from django.core.management.base import BaseCommand, CommandError

from audit.anchor import anchor_copy_path, anchor_path
from audit.services import audit_verify


class Command(BaseCommand):
    help = (
        "Recompute the audit log's hash chain, check it against the anchor file outside the "
        "database and its copy (events deleted after the last verification; an anchor missing "
        "for a log that has events) and the database's append-only guard; then move the anchor "
        "to the verified head. Exits non-zero on any problem."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-anchor-update",
            action="store_true",
            help="Check only; leave the anchor file as it is.",
        )
        parser.add_argument(
            "--reset-anchor",
            metavar="REASON",
            default="",
            help=(
                "Accept the log as it is now as the new reference (after looking into a reported "
                "anchor problem, or a log that has events and no anchor). Writes an audit event "
                "with REASON. The chain must still verify."
            ),
        )

    def handle(self, *args, **options):
        result = audit_verify(
            update_anchor=not options["no_anchor_update"],
            reset_anchor_reason=options["reset_anchor"].strip(),
        )
        for note in result.notes:
            self.stdout.write(note)
        if not result.ok:
            raise CommandError(
                "; ".join(result.problems) + f". {result.checked} events read. "
                f"Anchor file: {anchor_path()}{self._copy_note()}."
            )
        message = f"Audit chain intact: {result.checked} events verified."
        anchor = result.anchor_written or result.anchor_before
        if anchor is not None:
            message += f" Anchor: {anchor.describe()} in {anchor_path()}{self._copy_note()}."
        self.stdout.write(self.style.SUCCESS(message))

    @staticmethod
    def _copy_note() -> str:
        copy = anchor_copy_path()
        return f" (copy: {copy})" if copy else ""
