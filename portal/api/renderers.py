"""JSON that renders whatever text is stored.

The parsers (portal.api.parsers) refuse lone UTF-16 surrogates, but rows written before they
did may hold some (SQLite stores them inside JSON columns). UTF-8 cannot encode them, so
such a row made every list it appeared in a 500; here the response falls back to ASCII JSON,
where they are written as ``\\udXXX`` escapes, as JSON allows.
"""

from rest_framework import renderers


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            self.ensure_ascii = True
            return super().render(data, accepted_media_type, renderer_context)
