"""Pagination that refuses what it cannot read: `?limit=abc` or `?offset=-1` is a 400, not a silent default; and
reads a page as its ids first, then those rows with what they join, so a page deep into 10,000 rows sorts and
skips ids alone (an index scan), not joined rows."""
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """DRF's limit/offset pages (50 by default, at most MAX_LIMIT), with bad values answered 400."""

    max_limit = MAX_LIMIT

    def _read(self, request, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
        raw = request.query_params.get(name)
        if raw is None:
            return None
        if not raw.isascii() or not raw.isdigit() or not minimum <= int(raw) <= (maximum or 2**31 - 1):
            bound = f"between {minimum} and {maximum}" if maximum else f"at least {minimum}"
            raise ValidationError({name: [f"A whole number {bound}; got {raw!r}."]})
        return int(raw)

    def paginate_queryset(self, queryset, request, view=None):
        """DRF's, but the page's rows are loaded by id: count, ids and rows are three queries at any size."""
        self.request = request
        self.limit = self.get_limit(request)
        self.count = self.get_count(queryset)
        self.offset = self.get_offset(request)
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        if self.count == 0 or self.offset > self.count:
            return []
        ids = list(queryset.values_list("pk", flat=True)[self.offset:self.offset + self.limit])
        rows = {row.pk: row for row in queryset.order_by().filter(pk__in=ids)}
        return [rows[pk] for pk in ids if pk in rows]

    def get_limit(self, request):
        limit = self._read(request, self.limit_query_param, minimum=1, maximum=self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request):
        return self._read(request, self.offset_query_param, minimum=0) or 0

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        for p in params:
            bounds = ({"minimum": 1, "maximum": self.max_limit} if p["name"] == self.limit_query_param
                      else {"minimum": 0, "maximum": 2**31 - 1})
            p["schema"].update(bounds)
        return params
