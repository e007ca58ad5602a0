"""API: a job's runtime extensions, deciding them, and idle-reclaim exemptions.

``GET|POST /api/v1/jobs/{id}/extensions``, ``GET /api/v1/runtime-extensions`` (+
``approve``, ``reject``), ``POST /api/v1/jobs/{id}/exempt``.
"""

from django.urls import re_path
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.filters import IdFilter, path_id
from portal.api.routers import OptionalSlashRouter
from portal.api.views import validated
from portal.errors import NotFoundError

from .. import selectors as scheduling_selectors
from ..api.serializers import JobSerializer
from ..choices import ExtensionState
from ..models import Job, RuntimeExtension
from ..services import limits, reclaim
from . import selectors

# --- serializers ------------------------------------------------------------------------------


class RuntimeExtensionSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    requested_by = serializers.CharField(source="requested_by.username")
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True, default=None)

    class Meta:
        model = RuntimeExtension
        fields = [
            "id",
            "job",
            "tenant",
            "seconds",
            "reason",
            "state",
            "requested_by",
            "created_at",
            "decided_by",
            "decided_at",
            "comment",
        ]
        read_only_fields = fields


class RuntimeExtensionCreateSerializer(serializers.Serializer):
    seconds = serializers.IntegerField(min_value=1, max_value=limits.MAX_EXTENSION_SECONDS)
    reason = serializers.CharField(max_length=2000)


class ExtensionStepSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class IdleExemptSerializer(serializers.Serializer):
    until = serializers.DateTimeField(
        allow_null=True, help_text="End of the exemption; null ends an exemption now."
    )
    reason = serializers.CharField(max_length=2000)


# --- views ------------------------------------------------------------------------------------


def _visible_job(user, pk) -> Job:
    job = scheduling_selectors.jobs_visible_to(user).filter(pk=pk).first()
    if job is None:
        raise NotFoundError("Job not found.")
    return job


class JobExtensionsView(generics.ListCreateAPIView):
    """A job's runtime extensions (newest first); POST asks for more runtime: granted at once
    within the policy's ``extension_cap_seconds``, otherwise pending an admin's decision."""

    serializer_class = RuntimeExtensionSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the OpenAPI schema generator
            return RuntimeExtension.objects.none()
        job = _visible_job(self.request.user, self.kwargs["pk"])
        return selectors.extensions_visible_to(self.request.user).filter(job=job).order_by("-id")

    @extend_schema(
        request=RuntimeExtensionCreateSerializer, responses={201: RuntimeExtensionSerializer}
    )
    def post(self, request, pk):
        job = _visible_job(request.user, pk)
        data = validated(RuntimeExtensionCreateSerializer, request.data)
        extension = limits.runtime_extension_request(user=request.user, job=job, **data)
        fresh = selectors.extensions_visible_to(request.user).get(pk=extension.pk)
        return Response(RuntimeExtensionSerializer(fresh).data, status=status.HTTP_201_CREATED)


class RuntimeExtensionFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=ExtensionState.choices)
    job = IdFilter(field_name="job_id")
    tenant = filters.CharFilter(field_name="tenant__slug")
    decidable = filters.BooleanFilter(
        method="filter_decidable", label="Only those you may approve or reject now."
    )

    class Meta:
        model = RuntimeExtension
        fields = ["state", "job", "tenant"]

    def filter_decidable(self, queryset, name, value):
        if not value:
            return queryset
        decidable = selectors.extensions_decidable_by(self.request.user)
        return queryset.filter(pk__in=decidable.values("pk"))


class RuntimeExtensionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Runtime extensions of your tenants; tenant admins and platform admins decide them."""

    serializer_class = RuntimeExtensionSerializer
    filterset_class = RuntimeExtensionFilter

    def get_queryset(self):
        return selectors.extensions_visible_to(self.request.user).order_by("-id")

    def get_object(self):
        extension = (
            self.get_queryset()
            .filter(pk=path_id(self.kwargs["pk"], "Runtime extension not found."))
            .first()
        )
        if extension is None:
            raise NotFoundError("Runtime extension not found.")
        return extension

    def _step(self, request, service):
        extension = self.get_object()
        comment = validated(ExtensionStepSerializer, request.data)["comment"]
        service(extension=extension, user=request.user, comment=comment)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(request=ExtensionStepSerializer, responses=RuntimeExtensionSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Grant it: its time is added to the job's runtime limit (never your own request)."""
        return self._step(request, limits.runtime_extension_approve)

    @extend_schema(request=ExtensionStepSerializer, responses=RuntimeExtensionSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._step(request, limits.runtime_extension_reject)


class JobIdleExemptView(APIView):
    """Exempt a job from idle reclaim until a time (tenant admins and platform admins)."""

    @extend_schema(request=IdleExemptSerializer, responses=JobSerializer)
    def post(self, request, pk):
        job = _visible_job(request.user, pk)
        data = validated(IdleExemptSerializer, request.data)
        reclaim.job_idle_exempt(user=request.user, job=job, **data)
        return Response(JobSerializer(_visible_job(request.user, pk)).data)


router = OptionalSlashRouter()
router.register("runtime-extensions", RuntimeExtensionViewSet, basename="runtime-extension")

urlpatterns = [
    re_path(
        r"^jobs/(?P<pk>[0-9]+)/extensions/?$",
        JobExtensionsView.as_view(),
        name="job-extensions",
    ),
    re_path(r"^jobs/(?P<pk>[0-9]+)/exempt/?$", JobIdleExemptView.as_view(), name="job-exempt"),
    *router.urls,
]
