"""The audit log page: filters, paging, and a streamed CSV export of the filtered events."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.csvexport import line_writer, spreadsheet_safe
from tenants.selectors import is_platform_admin

from .filters import AuditEventFilter
from .models import EVENT_COLUMNS
from .selectors import audit_events_visible_to, audit_tenant_slugs, may_read_audit_log
from .services import audit_last_verification


def _filtered(request) -> AuditEventFilter:
    if not may_read_audit_log(request.user):
        raise PermissionDenied("Only tenant admins and platform admins may read the audit log.")
    queryset = audit_events_visible_to(request.user).order_by("-id")
    return AuditEventFilter(request.GET or None, queryset=queryset)


@login_required
def audit_list(request):
    events = _filtered(request)
    page = Paginator(events.qs, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "audit/audit_list.html",
        {
            "filter": events,
            "page": page,
            "query": query.urlencode(),
            "tenant_slugs": audit_tenant_slugs(request.user),
            # The whole log's integrity is a platform matter: tenant admins see their events only.
            "verification": _verification_for_page() if is_platform_admin(request.user) else None,
        },
    )


def _verification_for_page() -> dict:
    last = audit_last_verification()
    if last is None:
        return {"known": False}
    return {**last, "known": True, "verified_at": parse_datetime(last["verified_at"])}


def _cell(value) -> str:
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True)
    text = "" if value is None else str(value)
    return spreadsheet_safe(text)


def _value(event, column: str):
    if column == "id":
        return event.pk
    if column == "created_at":
        return event.created_at.isoformat()
    if column == "actor":
        return event.actor_label
    if column == "tenant":
        return event.tenant.slug if event.tenant_id else ""
    return getattr(event, column)


def _row(event) -> list[str]:
    return [_cell(_value(event, column)) for column in EVENT_COLUMNS]


@login_required
def audit_export(request):
    """The events of the current filters as CSV, streamed (no size limit, flat memory)."""
    events = _filtered(request)
    writer = line_writer()
    rows = (_row(e) for e in events.qs.iterator(chunk_size=2000))
    lines = (writer.writerow(r) for r in _with_header(rows))
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="sluice-audit-{stamp}.csv"'
    return response


def _with_header(rows):
    yield list(EVENT_COLUMNS)
    yield from rows
