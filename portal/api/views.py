"""Shared API plumbing: input validation helper and token endpoint."""

from rest_framework import serializers
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.permissions import AllowAny


def validated(serializer_class: type[serializers.Serializer], data, **kwargs) -> dict:
    """Validate request input with an input serializer; errors become a 400 with field messages."""
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class TokenView(ObtainAuthToken):
    """POST username and password, get ``{"token": "..."}``; use it as ``Authorization: Token <key>``."""

    permission_classes = [AllowAny]
