"""Who: tenants (teams), their projects, and users' memberships with a role."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from .choices import MembershipSource, Role

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "Use 1-50 lowercase letters, digits and dashes, starting and ending with a letter or digit.",
)


unix_account_validator = RegexValidator(
    r"^[a-z_][a-z0-9_-]{0,31}$",
    "A Unix account name: 1-32 lowercase letters, digits, '_' and '-', not starting with a digit or '-'.",
)


class Tenant(models.Model):
    """A team or department that owns quota; users belong to it through memberships.

    ``unix_account`` is the account the tenant's jobs run as on GPU nodes; blank means the
    site's default mapping (``SLUICE_JOB_ACCOUNT``, ``sluice-<slug>`` unless configured).
    """

    slug = models.CharField(max_length=50, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, max_length=2000)
    active = models.BooleanField(default=True)
    unix_account = models.CharField(
        max_length=32,
        blank=True,
        validators=[unix_account_validator],
        help_text="Unix account its jobs run as on the nodes; blank: the site default "
        "(sluice-<tenant> unless SLUICE_JOB_ACCOUNT says otherwise).",
    )
    cancel_jobs_of_leavers = models.BooleanField(
        default=False,
        help_text="When the directory disables a user, cancel their waiting and running jobs "
        "in this tenant (off: their jobs run to the end).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Project(models.Model):
    """A unit of work inside a tenant (a model, a product); jobs belong to a project.

    A restricted project accepts jobs only from tenant admins and members holding the
    object permission ``submit_project`` (django-guardian) on it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.CharField(max_length=50, validators=[slug_validator])
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, max_length=2000)
    active = models.BooleanField(default=True)
    restricted = models.BooleanField(
        default=False, help_text="Only tenant admins and users granted 'submit' may submit jobs."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "slug"], name="project_unique_slug_per_tenant"
            )
        ]
        permissions = [("submit_project", "Can submit jobs to the project")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class Membership(models.Model):
    """A user's role in one tenant, added by hand (local) or synced from the directory."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    source = models.CharField(
        max_length=10,
        choices=MembershipSource.choices,
        default=MembershipSource.LOCAL,
        help_text="Directory memberships are synced from the directory's groups at each "
        "sign-in; only local ones are edited in Sluice.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant.slug} as {self.role}"
