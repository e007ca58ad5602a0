from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from portal.api.views import validated
from portal.errors import BusinessError, NotFoundError
from tenants import selectors, services
from tenants.models import Membership

from . import serializers as s

User = get_user_model()


class UserViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Users: platform admins create, change and deactivate; others see their tenants' users."""

    serializer_class = s.UserSerializer
    filterset_fields = ["is_active", "is_staff", "username"]
    ordering_fields = ["username", "date_joined"]

    def get_queryset(self):
        return selectors.users_visible_to(self.request.user)

    @extend_schema(request=s.UserCreateSerializer, responses={201: s.UserSerializer})
    def create(self, request):
        user = services.user_create(
            actor=request.user, **validated(s.UserCreateSerializer, request.data)
        )
        return Response(s.UserSerializer(user).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.UserUpdateSerializer, responses=s.UserSerializer)
    def partial_update(self, request, pk=None):
        user = services.user_update(
            actor=request.user,
            user=self.get_object(),
            **validated(s.UserUpdateSerializer, request.data),
        )
        return Response(s.UserSerializer(user).data)

    @extend_schema(request=None, responses=s.UserSerializer)
    @action(detail=True, methods=["post"])
    def deactivate(self, request, pk=None):
        user = services.user_deactivate(actor=request.user, user=self.get_object())
        return Response(s.UserSerializer(user).data)


class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Tenants the user belongs to (all of them for platform admins)."""

    serializer_class = s.TenantSerializer
    lookup_field = "slug"
    filterset_fields = ["active"]
    ordering_fields = ["slug", "name"]

    def get_queryset(self):
        return selectors.tenants_visible_to(self.request.user)

    @extend_schema(request=s.TenantWriteSerializer, responses={201: s.TenantSerializer})
    def create(self, request):
        tenant = services.tenant_create(
            actor=request.user, **validated(s.TenantWriteSerializer, request.data)
        )
        return Response(self.get_serializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer)
    def partial_update(self, request, slug=None):
        tenant = services.tenant_update(
            actor=request.user,
            tenant=self.get_object(),
            **validated(s.TenantUpdateSerializer, request.data),
        )
        return Response(self.get_serializer(tenant).data)


class MemberViewSet(viewsets.GenericViewSet):
    """Members of one tenant: ``/tenants/{slug}/members``; tenant admins add, change, remove."""

    serializer_class = s.MembershipSerializer
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"
    filterset_fields = ["role"]

    def _tenant(self):
        return selectors.tenant_get(self.request.user, self.kwargs["tenant_slug"])

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no tenant in the URL
            return Membership.objects.none()
        return selectors.memberships_of_tenant(self.request.user, self._tenant()).order_by(
            "user__username"
        )

    def _membership(self, username) -> Membership:
        return get_object_or_404(self.get_queryset(), user__username=username)

    def list(self, request, tenant_slug=None):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def retrieve(self, request, tenant_slug=None, username=None):
        return Response(self.get_serializer(self._membership(username)).data)

    @extend_schema(request=s.MembershipCreateSerializer, responses={201: s.MembershipSerializer})
    def create(self, request, tenant_slug=None):
        tenant = self._tenant()
        data = validated(s.MembershipCreateSerializer, request.data)
        user = User.objects.filter(username=data["username"]).first()
        if user is None:
            raise BusinessError(f"No user named {data['username']}.", field="username")
        membership = services.membership_add(
            actor=request.user, tenant=tenant, user=user, role=data["role"]
        )
        return Response(self.get_serializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request, tenant_slug=None, username=None):
        membership = self._membership(username)
        data = validated(s.MembershipUpdateSerializer, request.data)
        membership = services.membership_change_role(
            actor=request.user, membership=membership, role=data["role"]
        )
        return Response(self.get_serializer(membership).data)

    def destroy(self, request, tenant_slug=None, username=None):
        services.membership_remove(actor=request.user, membership=self._membership(username))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Projects of the user's tenants; tenant admins create and change them."""

    serializer_class = s.ProjectSerializer
    filterset_fields = {"tenant__slug": ["exact"], "active": ["exact"], "slug": ["exact"]}
    ordering_fields = ["slug", "name", "created_at"]

    def get_queryset(self):
        return selectors.projects_visible_to(self.request.user)

    @extend_schema(request=s.ProjectCreateSerializer, responses={201: s.ProjectSerializer})
    def create(self, request):
        data = validated(s.ProjectCreateSerializer, request.data)
        tenant = selectors.tenant_get(request.user, data.pop("tenant"))
        project = services.project_create(actor=request.user, tenant=tenant, **data)
        return Response(self.get_serializer(project).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ProjectUpdateSerializer, responses=s.ProjectSerializer)
    def partial_update(self, request, pk=None):
        project = services.project_update(
            actor=request.user,
            project=self.get_object(),
            **validated(s.ProjectUpdateSerializer, request.data),
        )
        return Response(self.get_serializer(project).data)

    @extend_schema(request=s.SubmitterSerializer, responses={204: None})
    @action(detail=True, methods=["post"])
    def submitters(self, request, pk=None):
        """Grant or revoke one member's right to submit to this (restricted) project."""
        project = self.get_object()
        data = validated(s.SubmitterSerializer, request.data)
        user = User.objects.filter(username=data["username"]).first()
        if user is None:
            raise NotFoundError("No such user.")
        services.project_set_submitter(
            actor=request.user, project=project, user=user, allowed=data["allowed"]
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
