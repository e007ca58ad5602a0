"""Robot accounts of a tenant: ``/tenants/{slug}/robots`` and their tokens.

Members of the tenant read them; its admins (and platform admins) make, change and delete
robots and their tokens. Anyone outside the tenant gets 404.
"""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response

from portal.api.views import validated
from tenants.selectors import tenant_get

from .. import robots
from ..models import ApiToken, RobotAccount
from .serializers import ApiTokenCreatedSerializer, ApiTokenCreateSerializer, ApiTokenSerializer


class RobotSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    role = serializers.CharField(read_only=True, allow_null=True)
    active = serializers.BooleanField(source="user.is_active", read_only=True)
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = RobotAccount
        fields = [
            "name",
            "username",
            "tenant",
            "role",
            "description",
            "active",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class RobotCreateSerializer(serializers.Serializer):
    name = serializers.SlugField(max_length=40)
    role = serializers.ChoiceField(choices=robots.ROBOT_ROLE_CHOICES)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class RobotUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=robots.ROBOT_ROLE_CHOICES, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class RobotViewSet(viewsets.GenericViewSet):
    """A tenant's robot accounts (service accounts for pipelines), each with a member or
    viewer role in the tenant and its own expiring API tokens. A robot never signs in to
    the pages; it sends ``Authorization: Token <key>``."""

    serializer_class = RobotSerializer
    queryset = RobotAccount.objects.none()  # for the schema; rows come from get_queryset
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"

    def _tenant(self):
        return tenant_get(self.request.user, self.kwargs["tenant_slug"])

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return RobotAccount.objects.none()
        return robots.robots_of_tenant(self.request.user, self._tenant())

    def _robot(self, name) -> RobotAccount:
        return robots.robot_get(self.request.user, self._tenant(), name)

    def list(self, request, tenant_slug=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def retrieve(self, request, tenant_slug=None, name=None):
        return Response(self.get_serializer(self._robot(name)).data)

    @extend_schema(request=RobotCreateSerializer, responses={201: RobotSerializer})
    def create(self, request, tenant_slug=None):
        tenant = self._tenant()
        data = validated(RobotCreateSerializer, request.data)
        robot = robots.robot_create(actor=request.user, tenant=tenant, **data)
        robot = robots.robot_get(request.user, tenant, robot.name)
        return Response(self.get_serializer(robot).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=RobotUpdateSerializer, responses=RobotSerializer)
    def partial_update(self, request, tenant_slug=None, name=None):
        robot = self._robot(name)
        data = validated(RobotUpdateSerializer, request.data)
        robot = robots.robot_update(actor=request.user, robot=robot, **data)
        return Response(self.get_serializer(robot).data)

    @extend_schema(
        description="Delete the robot: its tokens are revoked at once, its membership ends."
    )
    def destroy(self, request, tenant_slug=None, name=None):
        robots.robot_delete(actor=request.user, robot=self._robot(name))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RobotTokenViewSet(viewsets.GenericViewSet):
    """A robot's API tokens: listed (never the key), made (the key shown once), revoked."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()

    def _robot(self) -> RobotAccount:
        tenant = tenant_get(self.request.user, self.kwargs["tenant_slug"])
        return robots.robot_get(self.request.user, tenant, self.kwargs["name"])

    def list(self, request, tenant_slug=None, name=None):
        page = self.paginate_queryset(robots.robot_tokens(request.user, self._robot()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def create(self, request, tenant_slug=None, name=None):
        robot = self._robot()
        data = validated(ApiTokenCreateSerializer, request.data)
        token, key = robots.robot_token_create(
            actor=request.user,
            robot=robot,
            name=data["name"],
            expires_in_days=data.get("expires_in_days"),
        )
        body = {"token": key, **ApiTokenSerializer(token).data}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, tenant_slug=None, name=None, pk=None):
        robot = self._robot()
        token = robots.robot_token_get(request.user, robot, pk)
        robots.robot_token_revoke(actor=request.user, robot=robot, token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)
