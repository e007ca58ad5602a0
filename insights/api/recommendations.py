"""API of the recommendations: ``GET /api/v1/recommendations`` (filters ``kind``, ``state``,
``tenant``; open ones ranked by impact first), ``GET .../{id}``, and the steps ``POST
.../{id}/simulate`` (202, the what-if run queued), ``.../apply`` and ``.../dismiss``
(``reason`` required). Platform admins act; tenant admins read their tenants' (403 on the
steps); members and viewers get 403; another tenant's recommendation is 404.
"""

from __future__ import annotations

from django.db.models import Case, F, FloatField, Value, When
from django.db.models.functions import Cast
from django.urls import reverse
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from portal.api.filters import path_id
from portal.api.views import validated

from .. import recommendations as recs
from ..choices import RecommendationKind, RecommendationState
from ..models import Recommendation

# -- serializers ----------------------------------------------------------------------------


class RecommendationSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True, default=None)
    impact_gpu_hours = serializers.SerializerMethodField()
    simulated_effect = serializers.SerializerMethodField()

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "kind",
            "key",
            "state",
            "tenant",
            "title",
            "impact_gpu_hours",
            "evidence",
            "change",
            "simulation",
            "simulated_effect",
            "created_at",
            "updated_at",
            "decided_by",
            "decided_at",
            "dismiss_reason",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField())
    def get_impact_gpu_hours(self, rec) -> float:
        return float(rec.evidence.get("impact_gpu_hours") or 0)

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_simulated_effect(self, rec):
        """Null without a simulation; its state while it runs; figures before/after once done."""
        return recs.simulation_effect(rec)


class DismissSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, allow_blank=False, trim_whitespace=True)


SimulationQueued = inline_serializer(
    "RecommendationSimulationQueued",
    {
        "simulation": serializers.IntegerField(),
        "state": serializers.CharField(),
        "url": serializers.CharField(),
        "recommendation": RecommendationSerializer(),
    },
)

# -- views ---------------------------------------------------------------------------------------


class RecommendationFilter(filters.FilterSet):
    kind = filters.ChoiceFilter(choices=RecommendationKind.choices)
    state = filters.ChoiceFilter(choices=RecommendationState.choices)
    tenant = filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = Recommendation
        fields = ["kind", "state", "tenant"]


class RecommendationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Recommendations computed daily from the recorded history, with their evidence and change."""

    serializer_class = RecommendationSerializer
    filterset_class = RecommendationFilter
    ordering_fields = ["updated_at", "created_at", "decided_at", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Recommendation.objects.none()
        recs.recommendations_check_access(self.request.user)
        # Open ones first, largest impact first; then the decided ones, newest first.
        impact = Cast(F("evidence__impact_gpu_hours"), FloatField())
        return recs.recommendations_visible_to(self.request.user).order_by(
            Case(When(state=RecommendationState.OPEN, then=Value(0)), default=Value(1)),
            Case(When(state=RecommendationState.OPEN, then=impact), default=Value(0.0)).desc(),
            F("decided_at").desc(nulls_last=True),
            "-id",
        )

    def get_object(self):
        pk = path_id(self.kwargs["pk"], "Recommendation not found.")
        return recs.recommendation_get(self.request.user, pk)

    @extend_schema(request=None, responses={202: SimulationQueued})
    @action(detail=True, methods=["post"])
    def simulate(self, request, pk=None):
        """Queue a what-if replay of the recorded history with the change (platform admins);
        400 with code ``not_simulatable`` for changes the simulator cannot replay."""
        rec = self.get_object()
        run = recs.recommendation_simulate(user=request.user, recommendation=rec)
        fresh = recs.recommendation_get(request.user, rec.pk)
        return Response(
            {
                "simulation": run.pk,
                "state": run.state,
                "url": reverse("simulate-run", args=[run.pk]),
                "recommendation": self.get_serializer(fresh).data,
            },
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(request=None, responses=RecommendationSerializer)
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Make the change through the configuration services (platform admins); audited."""
        rec = self.get_object()
        recs.recommendation_apply(user=request.user, recommendation=rec)
        return Response(self.get_serializer(recs.recommendation_get(request.user, rec.pk)).data)

    @extend_schema(request=DismissSerializer, responses=RecommendationSerializer)
    @action(detail=True, methods=["post"])
    def dismiss(self, request, pk=None):
        """Close it without acting, with a reason (platform admins)."""
        rec = self.get_object()
        data = validated(DismissSerializer, request.data)
        recs.recommendation_dismiss(user=request.user, recommendation=rec, reason=data["reason"])
        return Response(self.get_serializer(recs.recommendation_get(request.user, rec.pk)).data)
