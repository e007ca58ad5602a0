"""Helpers to show business errors as form errors on pages."""

from django import forms

from portal.errors import BusinessError


def add_business_error(form: forms.Form, error: BusinessError) -> None:
    """Attach a service's error to the form: field messages where the field exists, else non-field."""
    placed = False
    for field, messages in error.errors.items():
        for message in messages:
            if field in form.fields:
                form.add_error(field, message)
                placed = True
    if not placed:
        form.add_error(None, error.message)
