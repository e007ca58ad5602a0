"""Audit log filters, shared by the API and the page: time range, actor, action, tenant, target."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import django_filters as filters
from django import forms
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from .models import AuditEvent


class MomentField(forms.Field):
    """A date-time in ISO 8601 (``2026-12-02T14:55``, with or without zone) or a plain date.

    Cleans to ``(aware datetime, is_date_only)`` so ``until`` can include the whole day.
    """

    widget = forms.TextInput(attrs={"placeholder": "2026-12-02 or 2026-12-02T14:55"})

    def to_python(self, value):
        value = (value or "").strip()
        if not value:
            return None
        try:
            day = parse_date(value)  # first: a plain date also parses as midnight
        except ValueError:
            day = None
        try:
            moment = None if day else parse_datetime(value.replace(" ", "T", 1))
        except ValueError:
            moment = None
        if moment is None and day is None:
            raise forms.ValidationError(
                "Give a date (2026-12-02) or an ISO date-time (2026-12-02T14:55)."
            )
        if day is not None:
            moment = datetime.combine(day, time.min)
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        # The database keeps UTC, and a whole day is read up to the next midnight: a moment
        # at the edge of the calendar cannot be either (OverflowError, a 500 before).
        # Kept in UTC: PostgreSQL refuses offsets beyond ±15:59 that Python accepts.
        try:
            (moment + timedelta(days=1)).astimezone(UTC)
            moment = moment.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("Give a moment between the years 1 and 9999.") from None
        return moment, day is not None


class MomentFilter(filters.Filter):
    field_class = MomentField


class AuditEventFilter(filters.FilterSet):
    since = MomentFilter(field_name="created_at", method="filter_since", label="Since")
    until = MomentFilter(field_name="created_at", method="filter_until", label="Until")
    actor = filters.CharFilter(field_name="actor_label", label="Actor (username or 'system')")
    action = filters.CharFilter(
        method="filter_action", label="Action (exact, or a prefix ending in '.')"
    )
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant")
    target_type = filters.CharFilter(label="Target type")
    target_id = filters.CharFilter(label="Target id")

    class Meta:
        model = AuditEvent
        fields = ["since", "until", "actor", "action", "tenant", "target_type", "target_id"]

    def filter_since(self, queryset, name, value):
        return queryset.filter(created_at__gte=value[0])

    def filter_until(self, queryset, name, value):
        moment, date_only = value
        if date_only:  # the whole day
            return queryset.filter(created_at__lt=moment + timedelta(days=1))
        return queryset.filter(created_at__lte=moment)

    def filter_action(self, queryset, name, value):
        if value.endswith("."):
            return queryset.filter(action__startswith=value)
        return queryset.filter(action=value)
