from django.contrib import admin, messages
from knox.models import AuthToken

from . import services
from .models import ApiToken

# knox registers its own token model, which Sluice replaces by ApiToken (KNOX_TOKEN_MODEL).
if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are read here and revoked through the service (audited); never edited."""

    list_display = ["name", "user", "prefix", "created", "expiry", "last_used_at"]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "token_key"]
    list_filter = ["created", "expiry"]
    fields = ["name", "user", "prefix", "created", "expiry", "last_used_at"]
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["view"])
    def revoke(self, request, queryset):
        count = 0
        for token in queryset.select_related("user"):
            services.api_token_revoke(
                actor=request.user, token=token, reason="Revoked in the admin"
            )
            count += 1
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)
