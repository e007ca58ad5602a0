from django.contrib.auth import authenticate
from rest_framework import exceptions, serializers

from ..constants import token_max_days
from ..lockout import is_locked_out, lockout_message, lockout_retry_after
from ..models import ApiToken

# The name a token made by POST /api/v1/auth/token gets when the client sends none.
SIGN_IN_TOKEN_NAME = "auth/token"


class SignInLockedOut(exceptions.APIException):
    """The account is locked after too many failed sign-ins (429, with when to retry)."""

    status_code = 429
    default_detail = "Too many failed sign-ins for this account."
    default_code = "locked_out"

    def __init__(self, detail=None, *, wait: int | None = None):
        super().__init__(detail)
        # DRF's exception handler turns it into the answer's Retry-After (seconds).
        self.wait = wait


class ApiTokenSerializer(serializers.ModelSerializer):
    """A token as listed: never its key, never its digest."""

    user = serializers.CharField(source="user.username", read_only=True)
    prefix = serializers.CharField(read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "prefix", "name", "user", "created", "expiry", "last_used_at"]
        read_only_fields = fields


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """The answer to making a token: the only time the key (``token``) is ever shown."""

    token = serializers.CharField(read_only=True, help_text="The key; it is not shown again.")

    class Meta(ApiTokenSerializer.Meta):
        fields = ["token", *ApiTokenSerializer.Meta.fields]
        read_only_fields = fields


def _check_days(value):
    if value is not None and value > token_max_days():
        raise serializers.ValidationError(f"At most {token_max_days()} days.")
    return value


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, help_text="Default SLUICE_API_TOKEN_DAYS."
    )

    def validate_expires_in_days(self, value):
        return _check_days(value)


class TokenObtainSerializer(serializers.Serializer):
    """Username and password for a new token. The password check goes through
    ``authenticate(request=...)`` so that django-axes counts failures and refuses locked
    accounts (429)."""

    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"}, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, default=SIGN_IN_TOKEN_NAME)
    expires_in_days = serializers.IntegerField(min_value=1, required=False, allow_null=True)

    def validate_expires_in_days(self, value):
        return _check_days(value)

    def validate(self, attrs):
        request = self.context["request"]
        user = authenticate(request=request, username=attrs["username"], password=attrs["password"])
        if user is None:
            if is_locked_out(request):
                raise SignInLockedOut(
                    lockout_message(attrs["username"]),
                    wait=lockout_retry_after(attrs["username"]),
                )
            raise serializers.ValidationError(
                "Unable to log in with provided credentials.", code="authorization"
            )
        attrs["user"] = user
        return attrs
