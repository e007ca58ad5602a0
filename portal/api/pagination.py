from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination

# Far beyond any real page; keeps int() from parsing thousands of digits.
MAX_PAGE_DIGITS = 18


def _page_param(request, name: str, *, default=None):
    """A positive whole number from the query string; anything else is a 400 naming ``name``."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_PAGE_DIGITS) or int(raw) < 1:
        raise ValidationError({name: ["A whole number from 1 up."]})
    return int(raw)


class StandardPagination(PageNumberPagination):
    """Every list is paginated; clients may ask for up to 500 rows a page.

    A ``page`` or ``page_size`` that is not a positive whole number is a 400 naming it; a
    page past the last one is a 404; a ``page_size`` above 500 gives 500 rows.
    """

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        size = _page_param(request, self.page_size_query_param, default=self.page_size)
        return min(size, self.max_page_size)

    def get_page_number(self, request, paginator):
        if request.query_params.get(self.page_query_param) in self.last_page_strings:
            return paginator.num_pages
        return _page_param(request, self.page_query_param, default=1)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = (
                    f"Rows per page (default {self.page_size}, at most {self.max_page_size})."
                )
        return parameters
