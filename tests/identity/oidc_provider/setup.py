"""Prepare the provider's state: database, RS256 key, users and groups, Sluice's client.

Run as ``python -m tests.identity.oidc_provider.setup <redirect-uri>...`` with
``OIDC_PROVIDER_DIR`` and ``DJANGO_SETTINGS_MODULE`` set; prints nothing on success.
"""

import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

PASSWORD = "provider-password-1"
CLIENT_ID = "sluice"
CLIENT_SECRET = "sluice-client-secret"
#: username -> (groups, active at the provider)
USERS = {
    "alice": (["nlp-members", "vision-viewers"], True),
    "erin": (["nlp-members"], True),
    "dora": (["nlp-members"], False),
    "nogroups": ([], True),
}


def main(redirect_uris: list[str]) -> None:
    state = Path(os.environ["OIDC_PROVIDER_DIR"])
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (state / "rsa.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    for username, (groups, active) in USERS.items():
        user = User.objects.create_user(
            username, f"{username}@example.org", PASSWORD, first_name=username.title()
        )
        user.is_active = active
        user.save()
        user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])
    Application.objects.create(
        name="Sluice",
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(redirect_uris),
        post_logout_redirect_uris=" ".join(
            u.replace("/oidc/callback/", "/login/") for u in redirect_uris
        ),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
