"""Sign-in pages beyond Django's own views: what a locked-out user sees (portal and admin sign-in alike)."""
import math

from axes.helpers import get_client_username, get_cool_off
from django.shortcuts import render


def locked_out(request, original_response=None, credentials=None):
    """django-axes' answer once a username has had too many wrong passwords from one address: 429, when to
    try again (also as Retry-After), and who can unlock it sooner."""
    seconds = int(get_cool_off(request).total_seconds())
    response = render(request, "registration/locked_out.html", {
        "username": get_client_username(request, credentials) or "", "minutes": math.ceil(seconds / 60),
    }, status=429)
    response["Retry-After"] = str(seconds)
    return response
