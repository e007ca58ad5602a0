from django.contrib.auth import get_user_model
from rest_framework import serializers

from tenants.choices import Role
from tenants.models import Membership, Project, Tenant

User = get_user_model()


class UserSerializer(serializers.ModelSerializer):
    # May be blank: a plain string in the schema, not format "email".
    email = serializers.CharField(read_only=True)

    class Meta:
        model = User
        fields = [
            "id",
            "username",
            "email",
            "first_name",
            "last_name",
            "is_active",
            "is_staff",
            "date_joined",
        ]
        read_only_fields = fields


class UserCreateSerializer(serializers.Serializer):
    username = serializers.RegexField(r"^[\w.@+-]+$", max_length=150)
    password = serializers.CharField(
        write_only=True, max_length=128, style={"input_type": "password"}
    )
    email = serializers.EmailField(required=False, allow_blank=True, max_length=254, default="")
    first_name = serializers.CharField(required=False, allow_blank=True, max_length=150, default="")
    last_name = serializers.CharField(required=False, allow_blank=True, max_length=150, default="")
    is_staff = serializers.BooleanField(required=False, default=False)


class UserUpdateSerializer(serializers.Serializer):
    email = serializers.EmailField(required=False, allow_blank=True, max_length=254)
    first_name = serializers.CharField(required=False, allow_blank=True, max_length=150)
    last_name = serializers.CharField(required=False, allow_blank=True, max_length=150)
    is_staff = serializers.BooleanField(required=False)
    is_active = serializers.BooleanField(required=False)


class TenantSerializer(serializers.ModelSerializer):
    my_role = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "description", "active", "my_role", "created_at"]
        read_only_fields = fields

    def get_my_role(self, tenant) -> str | None:
        from tenants.selectors import role_in

        return role_in(self.context["request"].user, tenant)


class TenantWriteSerializer(serializers.Serializer):
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=120)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )
    active = serializers.BooleanField(required=False, default=True)


class TenantUpdateSerializer(serializers.Serializer):
    slug = serializers.SlugField(max_length=50, required=False)
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.CharField(source="user.email", read_only=True)
    tenant = serializers.CharField(source="tenant.slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "tenant", "role", "created_at"]
        read_only_fields = fields


class MembershipCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ProjectSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)

    class Meta:
        model = Project
        fields = [
            "id",
            "tenant",
            "slug",
            "name",
            "description",
            "active",
            "restricted",
            "created_at",
        ]
        read_only_fields = fields


class ProjectCreateSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=50, help_text="Slug of the tenant.")
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=120)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )
    restricted = serializers.BooleanField(required=False, default=False)


class ProjectUpdateSerializer(serializers.Serializer):
    slug = serializers.SlugField(max_length=50, required=False)
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False)
    restricted = serializers.BooleanField(required=False)


class SubmitterSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    allowed = serializers.BooleanField()
