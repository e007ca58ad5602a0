"""API tokens, stored as a hash (django-rest-knox's scheme with our own model)."""

from django.db import models
from knox.models import AbstractAuthToken
from knox.settings import CONSTANTS


class ApiToken(AbstractAuthToken):
    """A personal API token, sent as ``Authorization: Token <key>``.

    Only the SHA-512 digest of the key and its first 15 characters (knox's lookup key) are
    stored; the key itself is shown once, when the token is made. A token always expires;
    revoking it deletes the row (the audit log keeps who revoked which token, and when).
    knox's ``digest`` primary key is replaced by a plain id so that URLs and the audit log
    never carry the digest.
    """

    id = models.BigAutoField(primary_key=True)
    digest = models.CharField(max_length=CONSTANTS.DIGEST_LENGTH, unique=True)
    name = models.CharField(max_length=100)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.user.get_username()})"

    @property
    def prefix(self) -> str:
        """The first characters of the key: enough for its owner to tell tokens apart."""
        return self.token_key[:8]
