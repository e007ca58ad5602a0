from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"


# Higher rank includes the rights of every lower one.
ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3}


class MembershipSource(models.TextChoices):
    """Where a membership comes from: added by hand in Sluice, or synced from the directory
    (OIDC groups or LDAP groups, through the directory group mapping) at each sign-in."""

    LOCAL = "local", "Local"
    DIRECTORY = "directory", "Directory"
