"""URL routes of the observability app."""

urlpatterns: list = []
