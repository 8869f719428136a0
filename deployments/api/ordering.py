"""`?ordering=` with the id as the last key: rows equal in the fields asked for (a status, a name) come in one
fixed order, so walking the pages of a list sees each row once, none twice and none skipped."""
from rest_framework.filters import OrderingFilter


class StableOrderingFilter(OrderingFilter):
    def get_ordering(self, request, queryset, view):
        ordering = super().get_ordering(request, queryset, view)
        if not ordering or any(f.lstrip("-") in ("id", "pk") for f in ordering):
            return ordering
        return [*ordering, "-id" if ordering[-1].startswith("-") else "id"]
