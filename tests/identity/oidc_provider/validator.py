from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    """Adds what Keycloak's mappers would: user name, e-mail, the groups claim (the user's
    Django groups) and a Unix account claim (``unix_<username>``)."""

    oidc_claim_scope = None  # every claim below goes in the ID token and userinfo

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "name": user.get_full_name(),
            "groups": sorted(user.groups.values_list("name", flat=True)),
            "unix_account": f"unix_{user.username}",
        }
