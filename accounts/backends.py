"""Local sign-in (user name and password kept by Sluice)."""

from django.contrib.auth.backends import ModelBackend

from .models import RobotAccount


class LocalAccountBackend(ModelBackend):
    """Django's password check, refusing robot accounts: a robot works through its API
    tokens only, even if someone gave its user a password (the pages, the admin and
    ``POST /api/v1/auth/token`` all sign in through here)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and RobotAccount.objects.filter(user_id=user.pk).exists():
            return None
        return user
