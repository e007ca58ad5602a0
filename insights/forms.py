"""Forms of the insights' pages."""

from django import forms

from .choices import RecommendationKind, RecommendationState


class RecommendationFilterForm(forms.Form):
    """Filters of the recommendations list; an unknown value is ignored (all shown)."""

    kind = forms.ChoiceField(
        choices=[("", "all kinds"), *RecommendationKind.choices], required=False
    )
    state = forms.ChoiceField(
        choices=[("", "open and decided"), *RecommendationState.choices], required=False
    )


class DismissForm(forms.Form):
    """Why a recommendation is dismissed (required: the team reads it later)."""

    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "Why not now?"}),
        error_messages={"required": "Say why the recommendation is dismissed."},
    )
