"""DRF authentication by API token: knox's hashed-token check, plus the last-used time."""

import binascii
from hmac import compare_digest

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from knox.auth import TokenAuthentication
from knox.crypto import hash_token
from knox.settings import CONSTANTS, knox_settings
from rest_framework import exceptions

from portal.sqlrows import ModelColumns, row_instances

from .constants import LAST_USED_RESOLUTION
from .models import ApiToken

_READERS = (ModelColumns(ApiToken, "k"), ModelColumns(get_user_model(), "u"))


def _tokens_with_key(token_key: str) -> list[ApiToken]:
    """The tokens whose key (their first characters) is ``token_key``, with their users:
    knox's ``filter(token_key=…).select_related("user")`` without the ORM compiling it at
    every API call."""
    quote = connection.ops.quote_name
    tokens, users = (quote(r.model._meta.db_table) for r in _READERS)
    sql = (
        f"SELECT {', '.join(r.select(connection) for r in _READERS)} "
        f"FROM {tokens} k JOIN {users} u ON u.id = k.user_id WHERE k.token_key = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [token_key])
        rows = cursor.fetchall()
    found = []
    for row in rows:
        token, user = row_instances(row, _READERS)
        token.user = user
        found.append(token)
    return found


class ApiTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``: knox finds the token by its first characters,
    compares the SHA-512 digest, refuses expired tokens (and deletes them) and inactive
    users. A token that worked gets its ``last_used_at`` set, at most once a minute."""

    def _cleanup_token(self, auth_token) -> bool:
        """Only the token presented: expired, it is deleted and refused. (knox also reads
        every other token of the user on each request to delete the expired ones: a query
        per API call; ``api_tokens_expired_delete`` does that in the hourly sweep.)"""
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False

    def _knox_credentials(self, token: bytes):
        """knox's ``TokenAuthentication.authenticate_credentials``, step for step, with the
        tokens read by ``_tokens_with_key``."""
        msg = _("Invalid token.")
        token = token.decode("utf-8")
        for auth_token in _tokens_with_key(token[: CONSTANTS.TOKEN_KEY_LENGTH]):
            if self._cleanup_token(auth_token):
                continue
            try:
                digest = hash_token(token)
            except (TypeError, binascii.Error):
                raise exceptions.AuthenticationFailed(msg) from None
            if compare_digest(digest, auth_token.digest):
                if knox_settings.AUTO_REFRESH and auth_token.expiry:
                    self.renew_token(auth_token)
                return self.validate_user(auth_token)
        raise exceptions.AuthenticationFailed(msg)

    def authenticate_credentials(self, token):
        user, auth_token = self._knox_credentials(token)
        now = timezone.now()
        last = auth_token.last_used_at
        if last is None or now - last >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=auth_token.pk).update(last_used_at=now)
            auth_token.last_used_at = now
        return user, auth_token
