from django.contrib.auth.signals import user_logged_in
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.views import validated
from portal.errors import BusinessError, PermissionDeniedError

from .. import selectors, services
from ..models import ApiToken
from . import serializers as s


def _created(token: ApiToken, key: str) -> dict:
    data = s.ApiTokenSerializer(token).data
    return {"token": key, **data}


class TokenView(APIView):
    """POST username and password, get a new API token: ``{"token": "...", "expiry": ...}``.

    Use it as ``Authorization: Token <key>``. The key is shown only in this answer (only its
    hash is stored); it expires after ``expires_in_days`` (default 90). Failed attempts
    count towards the sign-in lockout: a locked account answers 429, also with the right
    password.

    DELETE with ``Authorization: Token <key>`` revokes that token (a logout): no need to
    look up its id first.
    """

    def _signs_in(self) -> bool:
        # Called before DRF wraps the request (and with none while the schema is built).
        return getattr(self.request, "method", None) == "POST"

    def get_authenticators(self):
        # Signing in takes no credentials; a logout needs the token it ends.
        return [] if self._signs_in() else super().get_authenticators()

    def get_permissions(self):
        return [AllowAny()] if self._signs_in() else [IsAuthenticated()]

    @extend_schema(
        request=s.TokenObtainSerializer,
        responses={200: s.ApiTokenCreatedSerializer},
        auth=[],
    )
    def post(self, request):
        data = validated(s.TokenObtainSerializer, request.data, context={"request": request})
        user = data["user"]
        token, key = services.api_token_create(
            user=user, name=data["name"], expires_in_days=data.get("expires_in_days")
        )
        # As a form login does: last_login, and axes clears the failures counted so far.
        user_logged_in.send(sender=user.__class__, request=request, user=user)
        return Response(_created(token, key), status=status.HTTP_200_OK)

    @extend_schema(
        request=None,
        responses={
            204: OpenApiResponse(description="The token is revoked; it stops working at once."),
        },
        description="Revoke the API token that authenticates this request (a logout). "
        "A browser session has no such token: it revokes a token with "
        "DELETE /api/v1/auth/tokens/{id}.",
    )
    def delete(self, request):
        if not isinstance(request.auth, ApiToken):
            raise BusinessError(
                "This request is not authenticated by an API token, so there is none to "
                "revoke: send Authorization: Token <key>, or revoke a token by its id "
                "with DELETE /api/v1/auth/tokens/{id}.",
                code="no_token",
            )
        services.api_token_revoke(actor=request.user, token=request.auth, reason="logout")
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your API tokens: list (never the key), make one (the key is shown once), revoke.

    A platform admin may list any user's tokens (``?user=<username>``) and revoke them;
    anyone else's token id answers 404.
    """

    serializer_class = s.ApiTokenSerializer
    queryset = ApiToken.objects.none()  # for the schema; rows come from get_queryset
    ordering_fields = ["created", "expiry", "last_used_at"]

    def get_queryset(self):
        user = self.request.user
        if self.action != "list":
            return selectors.api_tokens_visible_to(user)
        username = self.request.query_params.get("user")
        if username:
            return selectors.api_tokens_visible_to(user).filter(user__username=username)
        return selectors.api_tokens_of(user)

    def get_object(self):
        return selectors.api_token_get(self.request.user, self.kwargs["pk"])

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "user", str, description="Another user's tokens (platform admins only)."
            )
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=s.ApiTokenCreateSerializer, responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request):
        if isinstance(request.auth, ApiToken):
            # A token that could mint tokens would outlive its own expiry.
            raise PermissionDeniedError(
                "Make new tokens from a browser session, or with your password at "
                "POST /api/v1/auth/token; not with a token."
            )
        data = validated(s.ApiTokenCreateSerializer, request.data)
        token, key = services.api_token_create(
            user=request.user, name=data["name"], expires_in_days=data.get("expires_in_days")
        )
        return Response(_created(token, key), status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        services.api_token_revoke(actor=request.user, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
