"""Directory identities (OIDC, LDAP) and the mapping from directory groups to roles."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from tenants.models import Tenant, unix_account_validator

from .choices import DirectorySource, GrantedRole, MappingSource


class DirectoryGroupRole(models.Model):
    """A directory group grants a role: a tenant role (admin, member, viewer) in ``tenant``,
    or platform admin (``tenant`` empty). Roles are synced from these rows at each sign-in.

    ``group`` is an OIDC group name as the groups claim carries it (``/gpu-team`` for
    Keycloak's full paths) or an LDAP group DN; matching is exact, LDAP DNs case-insensitive.
    """

    source = models.CharField(
        max_length=10, choices=MappingSource.choices, default=MappingSource.ANY
    )
    group = models.CharField(
        max_length=500, help_text="OIDC group name (groups claim) or LDAP group DN."
    )
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="directory_group_roles",
        help_text="Empty only for platform admin.",
    )
    role = models.CharField(max_length=20, choices=GrantedRole.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["source", "group", "tenant__slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "group", "tenant", "role"], name="directory_group_role_unique"
            )
        ]

    def __str__(self) -> str:
        where = self.tenant.slug if self.tenant_id else "platform"
        return f"{self.source}:{self.group} → {self.role} ({where})"

    def clean(self) -> None:
        if self.role == GrantedRole.PLATFORM_ADMIN and self.tenant_id is not None:
            raise ValidationError({"tenant": "Platform admin is granted without a tenant."})
        if self.role != GrantedRole.PLATFORM_ADMIN and self.tenant_id is None:
            raise ValidationError({"tenant": "A tenant role needs a tenant."})


class DirectoryIdentity(models.Model):
    """A user as the directory knows them: its source and subject (OIDC ``sub`` or LDAP
    DN), the Unix account and uid the directory gives them (what jobs run as under the
    ``{user}`` account mapping), and the last time they were synced."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_identity"
    )
    source = models.CharField(max_length=10, choices=DirectorySource.choices)
    subject = models.CharField(max_length=500, help_text="OIDC subject or LDAP DN.")
    unix_account = models.CharField(max_length=32, blank=True, validators=[unix_account_validator])
    unix_uid = models.PositiveIntegerField(null=True, blank=True)
    groups = models.JSONField(default=list, blank=True)
    granted_platform_admin = models.BooleanField(
        default=False, help_text="Platform admin came from the directory (removed with it)."
    )
    active = models.BooleanField(default=True)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "directory identities"
        ordering = ["source", "subject"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "subject"], name="directory_identity_unique_subject"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.source}: {self.subject})"
