"""URL routes of the gateway app."""

urlpatterns: list = []
