"""Shared API plumbing: the input validation helper.

The token endpoints (``auth/token``, ``auth/tokens``) live in ``accounts.api``.
"""

from rest_framework import serializers


def validated(serializer_class: type[serializers.Serializer], data, **kwargs) -> dict:
    """Validate request input with an input serializer; errors become a 400 with field messages."""
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
