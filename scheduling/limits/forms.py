"""Forms of the job page's limits panel (a decision's comment is portal.steps' form)."""

from django import forms

from ..services.limits import MAX_EXTENSION_SECONDS
from ..services.reclaim import MAX_IDLE_EXEMPTION


class ExtensionRequestForm(forms.Form):
    """Ask for more runtime, in minutes."""

    minutes = forms.IntegerField(min_value=1, max_value=MAX_EXTENSION_SECONDS // 60, initial=60)
    reason = forms.CharField(max_length=2000, widget=forms.TextInput())


class IdleExemptForm(forms.Form):
    """Exempt a job from idle reclaim for some hours (0 ends an exemption now)."""

    hours = forms.FloatField(
        label="Hours (0 ends an exemption)",
        min_value=0,
        max_value=MAX_IDLE_EXEMPTION.total_seconds() / 3600,
        initial=4,
    )
    reason = forms.CharField(max_length=2000, widget=forms.TextInput())
