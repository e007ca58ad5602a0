import os

from django.contrib.auth import views as auth_views
from django.contrib.auth.models import Group, User
from django.http import HttpResponse, HttpResponseForbidden
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST


@csrf_exempt
@require_POST
def set_groups(request, username):
    """Test control: replace a user's groups (as an admin would in Keycloak)."""
    if request.headers.get("X-Control-Token") != os.environ["OIDC_PROVIDER_CONTROL_TOKEN"]:
        return HttpResponseForbidden()
    user = User.objects.get(username=username)
    names = [n for n in request.POST.get("groups", "").split(",") if n]
    user.groups.set([Group.objects.get_or_create(name=n)[0] for n in names])
    return HttpResponse("ok")


urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("control/groups/<str:username>", set_groups),
]
