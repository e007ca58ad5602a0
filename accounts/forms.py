from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator

from .constants import token_default_days, token_max_days
from .lockout import is_locked_out, lockout_message


class LockoutAwareLoginMixin:
    """A refused sign-in says so when the account is locked, instead of "wrong password"
    (the form passes its request to ``authenticate``, which django-axes needs)."""

    def get_invalid_login_error(self):
        if is_locked_out(self.request):
            return ValidationError(
                lockout_message(self.cleaned_data.get("username")), code="locked_out"
            )
        return super().get_invalid_login_error()


class LoginForm(LockoutAwareLoginMixin, AuthenticationForm):
    pass


class AdminLoginForm(LockoutAwareLoginMixin, AdminAuthenticationForm):
    pass


class ApiTokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="Where the token is used, e.g. “laptop CLI” or “CI pipeline”.",
    )
    expires_in_days = forms.IntegerField(label="Expires in (days)", min_value=1)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields["expires_in_days"]
        field.initial = token_default_days()
        field.max_value = token_max_days()
        field.validators.append(MaxValueValidator(token_max_days()))
        field.widget.attrs["max"] = token_max_days()
        field.help_text = f"At most {token_max_days()} days."


class RobotCreateForm(forms.Form):
    name = forms.SlugField(
        max_length=40, help_text="Lower-case letters, digits and dashes, e.g. “ci”."
    )
    role = forms.ChoiceField(choices=[("member", "Member"), ("viewer", "Viewer")])
    description = forms.CharField(max_length=200, required=False)
