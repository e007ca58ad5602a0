"""``GET /api/v1/usage``: GPU-hours allocated and used, grouped and filtered, against the
guarantees (chargeback). JSON (paginated rows and a totals row) or CSV (``?format=csv`` or
``Accept: text/csv``), streamed so that a long range needs no more memory than a short one.
"""

from __future__ import annotations

import csv

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import renderers, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.pagination import StandardPagination
from portal.api.renderers import JSONRenderer

from .. import usage

# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(value) -> str | float | int:
    """A cell for CSV: numbers as they are, text defused when a spreadsheet would run it."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class UsageCSVRenderer(renderers.BaseRenderer):
    """``text/csv``: the header, the rows, then the totals row (first column ``total``)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        # Only reached for a non-streamed answer (the view streams reports itself).
        return b""


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_lines(report_columns, rows, totals):
    """The CSV text of a report, line by line."""
    writer = csv.writer(_Echo())
    header = [*report_columns, *usage.FIGURE_COLUMNS]
    yield writer.writerow(header)
    for row in rows:
        yield writer.writerow([csv_cell(row.get(c)) for c in header])
    first = report_columns[0] if report_columns else None
    total = [csv_cell(totals.get(c)) for c in usage.FIGURE_COLUMNS]
    group_cells = ["total" if c == first else "" for c in report_columns]
    if not report_columns:  # no group columns: the single row is the total already
        return
    yield writer.writerow([*group_cells, *total])


class UsageQuerySerializer(serializers.Serializer):
    start = serializers.DateField(
        required=False, help_text="First day (UTC), included; default 29 days before the end."
    )
    end = serializers.DateField(
        required=False, help_text="Last day (UTC), included; default today."
    )
    group_by = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=len(usage.GROUP_BY_CHOICES) * 2,
        help_text="Any of " + ", ".join(usage.GROUP_BY_CHOICES) + " (repeat or comma-separate).",
    )
    tenant = serializers.ListField(
        child=serializers.SlugField(max_length=50), required=False, max_length=200
    )
    project = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        max_length=200,
    )
    pool = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, max_length=200
    )
    user = serializers.ListField(
        child=serializers.CharField(max_length=150), required=False, max_length=200
    )

    def validate(self, attrs):
        end = attrs.get("end") or usage.default_range()[1]
        start = attrs.get("start") or usage.default_start(end)
        group_by = usage.split_values(attrs.get("group_by") or ()) or list(usage.DEFAULT_GROUP_BY)
        errors = {**usage.range_errors(start, end), **usage.group_by_errors(group_by)}
        if errors:
            raise serializers.ValidationError(errors)
        return usage.UsageQuery(
            start=start,
            end=end,
            group_by=usage.canonical_group_by(group_by),
            tenants=tuple(attrs.get("tenant") or ()),
            projects=tuple(attrs.get("project") or ()),
            pools=tuple(attrs.get("pool") or ()),
            users=tuple(attrs.get("user") or ()),
        )


class UsageRowSerializer(serializers.Serializer):
    """One row: the group columns asked for (others absent), then the figures."""

    day = serializers.DateField(required=False)
    tenant = serializers.CharField(required=False)
    project = serializers.CharField(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_null=True)
    workload_type = serializers.CharField(required=False)
    pool = serializers.CharField(required=False)
    gpu_model = serializers.CharField(required=False)
    allocated_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    sampled_gpu_hours = serializers.FloatField(
        help_text="Allocated GPU-hours with a known utilization sample."
    )
    utilization_pct = serializers.FloatField(
        allow_null=True,
        help_text="used / allocated; null when nothing was allocated or nothing was sampled "
        "(see utilization_note).",
    )
    utilization_note = serializers.CharField(
        allow_null=True,
        help_text='Why utilization_pct is null: "no samples" (GPU-hours held, no utilization '
        'sample: not 0 % used) or "nothing allocated"; null when it is a number.',
    )
    guaranteed_gpu_hours = serializers.FloatField(
        help_text="GPU-hours guaranteed by the matching quotas over the range (or day), each "
        "hour at the quota in force then (quota history)."
    )
    guarantee_allocated_pct = serializers.FloatField(allow_null=True)
    guarantee_used_pct = serializers.FloatField(allow_null=True)


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateField()
    end = serializers.DateField()
    hours = serializers.FloatField(help_text="Hours of the range gone so far.")
    group_by = serializers.ListField(child=serializers.CharField())
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = UsageRowSerializer(many=True)
    totals = UsageRowSerializer()


def _list_parameter(name: str, type_, description: str) -> OpenApiParameter:
    return OpenApiParameter(name, type_, many=True, explode=True, description=description)


class UsageView(APIView):
    """GPU-hours allocated and used per tenant, project, user, workload type, pool, GPU
    model and/or day, against the tenants' guarantees (chargeback)."""

    renderer_classes = [JSONRenderer, renderers.BrowsableAPIRenderer, UsageCSVRenderer]
    pagination_class = StandardPagination

    @extend_schema(
        operation_id="usage_report",
        parameters=[
            OpenApiParameter(
                "start",
                OpenApiTypes.DATE,
                description="First day (UTC); default: 29 days before the end.",
            ),
            OpenApiParameter(
                "end", OpenApiTypes.DATE, description="Last day (UTC), included; default: today."
            ),
            _list_parameter(
                "group_by",
                OpenApiTypes.STR,
                "Any of " + ", ".join(usage.GROUP_BY_CHOICES) + "; default tenant.",
            ),
            _list_parameter("tenant", OpenApiTypes.STR, "Tenant slug(s)."),
            _list_parameter("project", OpenApiTypes.INT, "Project id(s)."),
            _list_parameter("pool", OpenApiTypes.STR, "Pool name(s)."),
            _list_parameter("user", OpenApiTypes.STR, "User name(s)."),
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["json", "csv"],
                description="csv: the whole report as CSV (also with Accept: text/csv).",
            ),
            OpenApiParameter("page", OpenApiTypes.INT),
            OpenApiParameter("page_size", OpenApiTypes.INT),
        ],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="The report as CSV, totals last."
            ),
        },
    )
    def get(self, request):
        serializer = UsageQuerySerializer(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        query = serializer.validated_data
        if getattr(request.accepted_renderer, "format", "") == "csv":
            return _csv_response(request.user, query)
        report = usage.usage_report(request.user, query)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(report.rows, request, view=self)
        return Response(
            {
                "start": query.start.isoformat(),
                "end": query.end.isoformat(),
                "hours": report.hours,
                "group_by": list(report.columns),
                "count": paginator.page.paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "results": page,
                "totals": report.totals,
            }
        )

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors are JSON, even when CSV was asked for: a 400 says which field is wrong.
        if (
            isinstance(response, Response)
            and response.status_code >= 400
            and getattr(request, "accepted_renderer", None) is not None
            and request.accepted_renderer.format == "csv"
        ):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


def _csv_response(user, query: usage.UsageQuery) -> StreamingHttpResponse:
    now = timezone.now()
    columns = usage.canonical_group_by(query.group_by)
    guarantees = usage.guarantees_for(user, query)
    totals = usage.usage_totals(user, query, guarantees=guarantees, now=now)
    rows = usage.usage_rows_iter(user, query, guarantees=guarantees, now=now)
    response = StreamingHttpResponse(
        csv_lines(columns, rows, totals), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = (
        f'attachment; filename="sluice-usage-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"'
    )
    return response


@extend_schema_view(get=extend_schema(exclude=True))
class UsageSlashView(UsageView):
    """``/api/v1/usage/``: the same answer; documented once, without the slash."""
