from django import forms

from .choices import Role


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class ProjectForm(forms.Form):
    slug = forms.SlugField(max_length=50)
    name = forms.CharField(max_length=120)
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )
    restricted = forms.BooleanField(
        required=False, help_text="Only admins and granted members may submit."
    )
