"""Text no database can store: NUL and lone UTF-16 surrogates.

A JSON string may spell a lone surrogate (``"\\ud800"``): Python accepts it, UTF-8 cannot
encode it, PostgreSQL refuses it and SQLite stores something the JSON renderer then fails
on. NUL is refused by PostgreSQL text and jsonb columns alike. The API's parsers and filter
backend refuse both at the door (portal.api.parsers, portal.api.filters); services check
with :func:`holds_bad_text` for callers that do not come through the API.
"""

from __future__ import annotations

import json
import re

BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
BAD_TEXT_MESSAGE = "Text must not contain NUL characters or unpaired UTF-16 surrogates."


def printable(text: str) -> str:
    """``text`` with the characters that cannot be shown or stored spelled as JSON escapes."""
    return BAD_TEXT.sub(lambda m: json.dumps(m.group())[1:-1], text)


def holds_bad_text(value) -> bool:
    """Whether such a character hides anywhere in a JSON value, keys included."""
    if isinstance(value, str):
        return BAD_TEXT.search(value) is not None
    if isinstance(value, dict):
        return any(holds_bad_text(k) or holds_bad_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_bad_text(v) for v in value)
    return False
