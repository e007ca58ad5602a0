import json

from django import template

register = template.Library()


@register.filter
def as_json(value) -> str:
    """Before/after values as compact, stable JSON (auto-escaped by the template)."""
    if value is None:
        return "—"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
