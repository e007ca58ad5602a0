"""DRF authentication by API token: knox's hashed-token check, plus the last-used time."""

from django.utils import timezone
from knox.auth import TokenAuthentication

from .constants import LAST_USED_RESOLUTION
from .models import ApiToken


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

    def authenticate_credentials(self, token):
        user, auth_token = super().authenticate_credentials(token)
        now = timezone.now()
        last = auth_token.last_used_at
        if last is None or now - last >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=auth_token.pk).update(last_used_at=now)
            auth_token.last_used_at = now
        return user, auth_token
