from django.urls import path

from . import oidc

urlpatterns = [
    path(
        "oidc/authenticate/", oidc.SluiceOIDCRequestView.as_view(), name="oidc_authentication_init"
    ),
    path(
        "oidc/callback/", oidc.SluiceOIDCCallbackView.as_view(), name="oidc_authentication_callback"
    ),
]
