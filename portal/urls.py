from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.forms import AdminLoginForm
from identity import views as identity_views

from . import views

api_v1 = [
    path("", include("accounts.api.urls")),
    path("", include("tenants.api.urls")),
    path("", include("scheduling.limits.api")),
    path("", include("scheduling.api.urls")),
    path("", include("inference.api.urls")),
    path("", include("audit.api.urls")),
    path("", include("insights.api.urls")),
]

# The admin login says "locked" too, like the login page (django-axes lockout).
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    # The local form and the OIDC provider's button (identity.views); logout ends the
    # provider's session too when it offers end-session.
    path("login/", identity_views.LoginView.as_view(), name="login"),
    path("logout/", identity_views.logout, name="logout"),
    path("", include("identity.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start script from this URL (?script), not inline, and
    # api_docs.html has no inline style: the docs run under the site's strict CSP too.
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
        name="api-docs",
    ),
    path("", include("tenants.urls")),
    path("", include("scheduling.limits.urls")),
    path("", include("scheduling.urls")),
    path("", include("inference.urls")),
    path("", include("audit.urls")),
    path("", include("accounts.urls")),
    path("", include("insights.urls")),
]

# Error pages inside the layout (portal.views), and the icon browsers ask for at /favicon.ico.
handler403 = "portal.views.permission_denied"
handler404 = "portal.views.page_not_found"
handler500 = "portal.views.server_error"
urlpatterns += [
    path("favicon.ico", views.favicon, name="favicon"),
]
