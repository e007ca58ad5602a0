import base64
import binascii
import json
from collections import OrderedDict
from datetime import datetime

from django.core.paginator import EmptyPage, InvalidPage, Page, Paginator
from django.db.models import Q, QuerySet
from django.utils.functional import cached_property
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

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


class KeysFirstPaginator(Paginator):
    """Reads a page of a joined queryset in two steps: the page's primary keys (the
    filter and order on the base table alone, where an index serves ``ORDER BY ... LIMIT``),
    then those rows with their joins. In one query PostgreSQL joined every visible row
    before sorting and cutting the page: 50–110 ms (and as long again planning seven
    joins) for a jobs list of a few thousand rows, growing with the table."""

    def page(self, number):
        rows = self.object_list
        if (
            not isinstance(rows, QuerySet)
            or rows.query.distinct
            or not (rows.query.select_related or rows._prefetch_related_lookups)
        ):
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        keys = list(rows.values_list("pk", flat=True)[bottom:top])
        return self._get_page(self._rows_of(keys), number, self)

    def _rows_of(self, keys: list) -> list:
        """The rows of ``keys`` with their joins, in the order of ``keys``."""
        by_key = {row.pk: row for row in self.object_list.order_by().filter(pk__in=keys)}
        return [by_key[k] for k in keys if k in by_key]


class _OpenEndedPage(Page):
    """A page of a list counted only up to its paginator's ``count_limit``: whether a next
    page exists was read with the page (one row more), not from a count."""

    def __init__(self, object_list, number, paginator, *, more: bool):
        super().__init__(object_list, number, paginator)
        self.more = more

    def has_next(self) -> bool:
        return self.more

    def end_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + len(self.object_list)


class CountCappedPaginator(KeysFirstPaginator):
    """Pages of a list that may hold a million rows: rows are counted up to
    ``count_limit`` only (``count_capped`` says there are more), so that a page never
    costs a count of every row the user may see (400 ms for a tenant's 300,000 jobs).
    Beyond the limit a page is read with one row more, which tells whether another
    follows; pages stay numbered (``?page=``) and any page number is valid."""

    count_limit = 1_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        return rows.order_by()[: self.count_limit + 1].count()

    @property
    def count_capped(self) -> bool:
        """More rows than ``count_limit``: ``count`` and ``num_pages`` are lower bounds."""
        return isinstance(self.object_list, QuerySet) and self.count > self.count_limit

    def validate_number(self, number):
        try:
            return super().validate_number(number)
        except EmptyPage:
            if self.count_capped and int(number) >= 1:
                return int(number)  # past the counted rows: read to know
            raise

    def page(self, number):
        if not self.count_capped:
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        rows = self.object_list
        joined = rows.query.select_related or rows._prefetch_related_lookups
        # Past the first page the keys are read first as well, joined or not: the rows
        # skipped are then index entries, not table rows (page 2,000 of 1,000,000 jobs:
        # 100,000 of them).
        keys_first = (joined or bottom > 0) and not rows.query.distinct
        if keys_first:
            found = list(rows.values_list("pk", flat=True)[bottom : bottom + self.per_page + 1])
        else:
            found = list(rows[bottom : bottom + self.per_page + 1])
        if not found:
            raise EmptyPage("That page contains no results")
        more, found = len(found) > self.per_page, found[: self.per_page]
        if keys_first:
            found = self._rows_of(found)
        return _OpenEndedPage(found, number, self, more=more)

    def get_page(self, number):
        """As Django's, but a page past the end of a list counted only in part is the first."""
        if not self.count_capped:
            return super().get_page(number)
        try:
            return self.page(number)
        except InvalidPage:
            return self.page(1)


CURSOR_INVALID = "Not a cursor of this list: start again without one, or follow next."


def cursor_encode(position: dict, *, reverse: bool) -> str:
    """The opaque ``cursor`` of a page: where it starts (``position``: the ordering
    ``o``, the ordering field's value ``v`` and the row's ``id``) and whether it is read
    backwards (a ``previous`` link)."""
    raw = json.dumps({**position, "r": int(reverse)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor_decode(raw: str) -> dict:
    try:
        text = base64.urlsafe_b64decode((raw + "=" * (-len(raw) % 4)).encode("ascii"))
        position = json.loads(text)
    except (ValueError, binascii.Error, UnicodeError):
        raise ValidationError({"cursor": [CURSOR_INVALID]}) from None
    if (
        not isinstance(position, dict)
        or not isinstance(position.get("o"), str)
        or type(position.get("id")) is not int
        or position.get("r") not in (0, 1)
    ):
        raise ValidationError({"cursor": [CURSOR_INVALID]})
    return position


def _cursor_value(field, value):
    """The ordering field's value a cursor holds, checked for the field's type."""
    if field.get_internal_type() in ("DateTimeField",):
        try:
            parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise ValidationError({"cursor": [CURSOR_INVALID]})
        return parsed
    if type(value) is not int:
        raise ValidationError({"cursor": [CURSOR_INVALID]})
    return value


class StandardPagination(PageNumberPagination):
    """Every list is paginated; clients may ask for up to 500 rows a page.

    A ``page`` or ``page_size`` that is not a positive whole number is a 400 naming it; a
    page past the last one is a 404; a ``page_size`` above 500 gives 500 rows.

    Lists whose view names ``cursor_orderings`` are also paged by cursor (keyset), on
    request: ``?cursor=`` (empty: the first page) answers ``next`` and ``previous`` links
    that carry a cursor, and no ``count``. Each page then costs the same however deep it
    is (a page number is an OFFSET: the database reads every row before it). The
    ordering must be one of ``cursor_orderings``, either way; the row id breaks ties.
    """

    django_paginator_class = KeysFirstPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    cursor_query_param = "cursor"
    cursor_mode = False

    def paginate_queryset(self, queryset, request, view=None):
        if self.cursor_query_param not in request.query_params:
            return super().paginate_queryset(queryset, request, view)
        allowed = getattr(view, "cursor_orderings", ())
        if not allowed:
            raise ValidationError({"cursor": ["This list is paged by page number only."]})
        if self.page_query_param in request.query_params:
            raise ValidationError({"cursor": ["Give a cursor or a page number, not both."]})
        self.cursor_mode = True
        self.request = request
        return self._cursor_page(queryset, request, allowed)

    def _cursor_ordering(self, queryset, allowed) -> str:
        """The one ordering field (``-name``: descending) of ``queryset``, or a 400."""
        ordering = list(queryset.query.order_by or queryset.model._meta.ordering)
        if len(ordering) == 2 and ordering[1] in ("id", "-id", "pk", "-pk"):
            ordering = ordering[:1]  # the tie-break the cursor adds anyway
        if len(ordering) != 1 or not isinstance(ordering[0], str):
            ordering = [""]
        primary = {"pk": "id", "-pk": "-id"}.get(ordering[0], ordering[0])
        if primary.lstrip("-") not in allowed:
            names = ", ".join(allowed)
            raise ValidationError(
                {"ordering": [f"With a cursor, order by one of {names} (or -name: descending)."]}
            )
        return primary

    def _cursor_page(self, queryset, request, allowed) -> list:
        primary = self._cursor_ordering(queryset, allowed)
        name, descending = primary.lstrip("-"), primary.startswith("-")
        size = self.get_page_size(request)
        raw = request.query_params.get(self.cursor_query_param, "")
        position = _cursor_decode(raw) if raw else None
        if position is not None and position["o"] != primary:
            raise ValidationError({"cursor": ["This cursor belongs to another ordering."]})
        backwards = bool(position and position["r"])
        walk_down = descending != backwards
        rows = queryset
        if position is not None:
            op = "lt" if walk_down else "gt"
            if name == "id":
                rows = rows.filter(**{f"pk__{op}": position["id"]})
            else:
                value = _cursor_value(queryset.model._meta.get_field(name), position.get("v"))
                # The bound alone first: an index range PostgreSQL starts from (the OR
                # after it is only a filter; alone, it read 480,000 rows to skip them).
                rows = rows.filter(**{f"{name}__{op}e": value}).filter(
                    Q(**{f"{name}__{op}": value}) | Q(**{name: value, f"pk__{op}": position["id"]})
                )
        order = [f"-{name}" if walk_down else name]
        if name != "id":
            order.append("-pk" if walk_down else "pk")
        found = list(rows.order_by(*order)[: size + 1])
        more, found = len(found) > size, found[:size]
        if backwards:
            found.reverse()
        has_next, has_previous = (True, more) if backwards else (more, position is not None)
        self.next_link = (
            self._cursor_link(primary, found[-1], False) if has_next and found else None
        )
        self.previous_link = None
        if has_previous:
            self.previous_link = (
                self._cursor_link(primary, found[0], True) if found else self._first_link()
            )
        return found

    def _cursor_link(self, primary: str, row, reverse: bool) -> str:
        name = primary.lstrip("-")
        position = {"o": primary, "id": row.pk}
        if name != "id":
            value = getattr(row, name)
            position["v"] = value.isoformat() if isinstance(value, datetime) else value
        url = remove_query_param(self.request.build_absolute_uri(), self.page_query_param)
        return replace_query_param(
            url, self.cursor_query_param, cursor_encode(position, reverse=reverse)
        )

    def _first_link(self) -> str:
        url = remove_query_param(self.request.build_absolute_uri(), self.page_query_param)
        return replace_query_param(url, self.cursor_query_param, "")

    def get_paginated_response(self, data):
        if not self.cursor_mode:
            return Response(
                OrderedDict(
                    [
                        ("count", self._count()),
                        *self._count_flags(),
                        ("next", self.get_next_link()),
                        ("previous", self.get_previous_link()),
                        ("results", data),
                    ]
                )
            )
        return Response(
            OrderedDict(
                [("next", self.next_link), ("previous", self.previous_link), ("results", data)]
            )
        )

    def _count(self) -> int:
        return self.page.paginator.count

    def _count_flags(self) -> list:
        return []

    def get_paginated_response_schema(self, schema):
        envelope = super().get_paginated_response_schema(schema)
        envelope["required"] = ["results"]
        envelope["properties"]["count"]["description"] = (
            "How many rows the list holds (not given when paged by cursor)."
        )
        return envelope

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
        allowed = getattr(view, "cursor_orderings", ())
        if allowed:
            parameters.append(
                {
                    "name": self.cursor_query_param,
                    "required": False,
                    "in": "query",
                    "description": (
                        "Page by cursor instead of page number: empty for the first page, "
                        "then the one in the answer's next or previous link. The answer "
                        "has no count; each page costs the same however deep. Not with "
                        f"page; the ordering must be one of {', '.join(allowed)} "
                        "(either way)."
                    ),
                    "schema": {"type": "string"},
                }
            )
        return parameters


class CountCappedPagination(StandardPagination):
    """The pages of a list that may hold a million rows (``GET /api/v1/jobs``): rows are
    counted up to ``count_limit`` only. Up to it ``count`` is exact and ``count_capped``
    false; beyond it ``count`` is ``count_limit`` (the list holds at least that many) and
    ``count_capped`` true. ``next`` and ``previous`` stay exact (a page is read with one
    row more), and any page number up to the last is valid; ``page=last`` of a list counted
    in part is a 400 (its last page is unknown). Counting every row a user may see cost a
    third of a second at 1,000,000 jobs, on every page."""

    count_limit = 10_000

    def django_paginator_class(self, object_list, per_page):
        paginator = CountCappedPaginator(object_list, per_page)
        paginator.count_limit = self.count_limit
        return paginator

    def get_page_number(self, request, paginator):
        asked = request.query_params.get(self.page_query_param)
        if asked in self.last_page_strings and paginator.count_capped:
            raise ValidationError(
                {
                    self.page_query_param: [
                        f"This list holds more than {self.count_limit:,} rows, counted no "
                        "further: its last page is not known. Reverse the ordering instead."
                    ]
                }
            )
        return super().get_page_number(request, paginator)

    def _count(self) -> int:
        return min(self.page.paginator.count, self.count_limit)

    def _count_flags(self) -> list:
        return [("count_capped", self.page.paginator.count_capped)]

    def get_paginated_response_schema(self, schema):
        envelope = super().get_paginated_response_schema(schema)
        properties = envelope["properties"]
        properties["count"]["description"] = (
            f"How many rows the list holds, counted up to {self.count_limit:,}: with "
            f"count_capped true, at least {self.count_limit:,} (not given when paged by cursor)."
        )
        properties = {
            "count": properties.pop("count"),
            "count_capped": {
                "type": "boolean",
                "example": False,
                "description": (
                    f"Whether the list holds more than {self.count_limit:,} rows and count "
                    "stopped there; follow next to read on (not given when paged by cursor)."
                ),
            },
            **properties,
        }
        envelope["properties"] = properties
        return envelope
