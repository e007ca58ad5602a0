from django.db import models


class DirectorySource(models.TextChoices):
    """Where a signed-in identity comes from."""

    OIDC = "oidc", "OIDC"
    LDAP = "ldap", "LDAP / Active Directory"


class MappingSource(models.TextChoices):
    """Which directory a group mapping applies to."""

    OIDC = "oidc", "OIDC"
    LDAP = "ldap", "LDAP / Active Directory"
    ANY = "any", "Any"


class GrantedRole(models.TextChoices):
    """What a directory group grants: a tenant role, or platform admin (no tenant)."""

    VIEWER = "viewer", "Tenant viewer"
    MEMBER = "member", "Tenant member"
    ADMIN = "admin", "Tenant admin"
    PLATFORM_ADMIN = "platform_admin", "Platform admin"


ACTION_ROLE_GRANTED = "identity.role_granted"
ACTION_ROLE_CHANGED = "identity.role_changed"
ACTION_ROLE_REMOVED = "identity.role_removed"
ACTION_PLATFORM_ADMIN_GRANTED = "identity.platform_admin_granted"
ACTION_PLATFORM_ADMIN_REMOVED = "identity.platform_admin_removed"
ACTION_USER_CREATED = "identity.user_created"
ACTION_USER_LINKED = "identity.user_linked"
ACTION_USER_DISABLED = "identity.user_disabled"
ACTION_USER_REACTIVATED = "identity.user_reactivated"
ACTION_SESSIONS_EXPIRED = "identity.sessions_expired"
