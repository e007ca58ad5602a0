from django.utils.functional import SimpleLazyObject


def navigation(request):
    """Values every page's navigation needs (kept cheap: no queries unless logged in)."""
    user = getattr(request, "user", None)
    if not user or not user.is_authenticated:
        return {}
    unread = 0
    try:
        from scheduling.selectors import notifications_unread_count
    except ImportError:  # the notifications feature may not be installed yet
        notifications_unread_count = None
    if notifications_unread_count is not None:
        unread = notifications_unread_count(user)
    from tenants.selectors import administers_any_tenant, is_platform_admin

    return {
        "nav_unread_notifications": unread,
        "nav_is_platform_admin": is_platform_admin(user),
        # Approvals and audit links: evaluated (one query) only when a template asks.
        "nav_is_approver": SimpleLazyObject(lambda: administers_any_tenant(user)),
    }
