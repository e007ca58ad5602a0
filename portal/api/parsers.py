"""Request parsers that refuse text no database can store (see portal.text), before any
view sees it. Each parser checks every key and value of what it parsed, at any depth, and
answers 400 naming where the bad text is (``parameters.a``, ``command[1]``), so that no view
or serializer has to remember to.
"""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from portal.text import BAD_TEXT, BAD_TEXT_MESSAGE, printable

BAD_KEY_MESSAGE = "Names must not contain NUL characters or unpaired UTF-16 surrogates."
# No field of the API nests anywhere near this deep; far deeper would exhaust the stack of
# whatever walks it next (serializers, the JSON encoder of the database column).
MAX_DEPTH = 32
DEPTH_MESSAGE = f"Nested more than {MAX_DEPTH} levels deep."


def _join(path: str, key: str) -> str:
    key = printable(key)
    return f"{path}.{key}" if path else key


def bad_text_errors(data) -> dict[str, list[str]]:
    """Where ``data`` (parsed JSON) holds a string that cannot be stored, or nests too deep.

    Keys are named as the API names fields elsewhere (see portal.api.errors): ``field``,
    ``field.key``, ``field[i]``; a bad key is reported at the object that holds it. The walk
    is a loop, not a recursion, so that no nesting depth can exhaust the stack.
    """
    errors: dict[str, list[str]] = {}
    stack = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or "non_field_errors"
        if isinstance(value, str):
            if BAD_TEXT.search(value):
                errors[where] = [BAD_TEXT_MESSAGE]
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            errors[where] = [DEPTH_MESSAGE]
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                if BAD_TEXT.search(key):
                    errors[where] = [BAD_KEY_MESSAGE]
                stack.append((item, _join(path, key), depth + 1))
        else:
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    return errors


def query_dict_errors(data) -> dict[str, list[str]]:
    """Like :func:`bad_text_errors` for a QueryDict: every value of every key."""
    errors: dict[str, list[str]] = {}
    for key, values in data.lists():
        if BAD_TEXT.search(key):
            errors.setdefault("non_field_errors", []).append(BAD_KEY_MESSAGE)
        for value in values:
            if isinstance(value, str) and BAD_TEXT.search(value):
                errors[printable(key)] = [BAD_TEXT_MESSAGE]
    return errors


def raise_for_bad_text(errors: dict[str, list[str]]) -> None:
    if errors:
        raise ValidationError(errors)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - {DEPTH_MESSAGE}") from None
        raise_for_bad_text(bad_text_errors(data))
        return data


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        raise_for_bad_text(query_dict_errors(data))
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        result = super().parse(stream, media_type, parser_context)
        raise_for_bad_text(query_dict_errors(result.data))
        return result
