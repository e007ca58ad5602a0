from django.contrib import admin

from .models import DirectoryGroupRole, DirectoryIdentity


@admin.register(DirectoryGroupRole)
class DirectoryGroupRoleAdmin(admin.ModelAdmin):
    """The mapping platform admins edit: which directory group grants which role."""

    list_display = ["group", "source", "tenant", "role"]
    list_filter = ["source", "role", "tenant"]
    search_fields = ["group", "tenant__slug"]
    autocomplete_fields = ["tenant"]


@admin.register(DirectoryIdentity)
class DirectoryIdentityAdmin(admin.ModelAdmin):
    """Read-only: identities are written by the directory sync at each sign-in."""

    list_display = ["user", "source", "subject", "unix_account", "active", "last_sign_in_at"]
    list_filter = ["source", "active"]
    search_fields = ["user__username", "subject", "unix_account"]
    readonly_fields = [f.name for f in DirectoryIdentity._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
