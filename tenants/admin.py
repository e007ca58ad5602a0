from django.contrib import admin
from guardian.admin import GuardedModelAdmin

from .models import Membership, Project, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "active", "unix_account"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Project)
class ProjectAdmin(GuardedModelAdmin):
    list_display = ["slug", "tenant", "name", "active", "restricted"]
    list_filter = ["tenant", "active"]
    search_fields = ["slug", "name"]
