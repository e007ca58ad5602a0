"""The login page (the provider's button beside or instead of the local form) and the
logout, which ends the provider's session too when it offers end-session."""

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import views as auth_views
from django.http import HttpResponseRedirect
from django.shortcuts import resolve_url
from django.views.decorators.http import require_POST

from .forms import DirectoryAwareLoginForm
from .oidc import oidc_enabled, provider_logout_url


class LoginView(auth_views.LoginView):
    form_class = DirectoryAwareLoginForm
    authentication_form = DirectoryAwareLoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        oidc = oidc_enabled()
        # Without OIDC the local form is the only way in, whatever SLUICE_LOCAL_LOGIN says.
        show_form = (
            not oidc
            or settings.SLUICE_LOCAL_LOGIN
            or "local" in self.request.GET
            or self.request.method == "POST"
        )
        context.update(
            oidc_enabled=oidc,
            oidc_button_label=settings.SLUICE_OIDC_BUTTON_LABEL,
            show_local_form=show_form,
            local_login_restricted=oidc and not settings.SLUICE_LOCAL_LOGIN,
        )
        return context


@require_POST
def logout(request):
    """End the Sluice session, then the provider's when it has an end-session endpoint."""
    provider_url = provider_logout_url(request)
    auth.logout(request)
    return HttpResponseRedirect(
        provider_url or resolve_url(settings.LOGOUT_REDIRECT_URL or "login")
    )
