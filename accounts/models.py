"""API tokens, stored as a hash (django-rest-knox's scheme with our own model), and robot accounts."""

from django.conf import settings
from django.db import models
from knox.models import AbstractAuthToken
from knox.settings import CONSTANTS


class ApiToken(AbstractAuthToken):
    """A personal API token, sent as ``Authorization: Token <key>``.

    Only the SHA-512 digest of the key and its first 15 characters (knox's lookup key) are
    stored; the key itself is shown once, when the token is made. A token always expires;
    revoking it deletes the row (the audit log keeps who revoked which token, and when).
    knox's ``digest`` primary key is replaced by a plain id so that URLs and the audit log
    never carry the digest.
    """

    id = models.BigAutoField(primary_key=True)
    digest = models.CharField(max_length=CONSTANTS.DIGEST_LENGTH, unique=True)
    name = models.CharField(max_length=100)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.user.get_username()})"

    @property
    def prefix(self) -> str:
        """The first characters of the key: enough for its owner to tell tokens apart."""
        return self.token_key[:8]


class RobotAccount(models.Model):
    """A service account of one tenant, for a pipeline (CI, an orchestrator).

    Its ``user`` has no usable password and is refused by every sign-in form (the pages,
    the admin, ``POST /api/v1/auth/token``); it works only through the API tokens a tenant
    admin makes for it. Its role (member or viewer) is an ordinary membership of ``tenant``,
    so it may do exactly what a person with that role may. Deleting a robot deactivates
    its user (its jobs keep their submitter), revokes its tokens and ends its membership.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="robot"
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="robots")
    name = models.SlugField(max_length=40, help_text="Unique in its tenant, e.g. “ci”.")
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="robot_unique_tenant_name")
        ]

    def __str__(self) -> str:
        return f"robot {self.name} of {self.tenant.slug}"
