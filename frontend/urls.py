"""URL routes of the frontend app."""

urlpatterns: list = []
