"""Personal access tokens for the REST API: list, create (secret shown once), revoke with confirmation."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from deployments.errors import ActionError
from deployments.models import AccessToken
from deployments.services.access_tokens import access_token_create, access_token_revoke
from deployments.services.credentials import user_lifetimes
from frontend.views.base import render_page
from frontend.views.keys import expiry_choices, expiry_from_form


def _tokens(user):
    return AccessToken.objects.filter(user=user).order_by("revoked_at", "-created_at")


@never_cache  # the page that shows a new secret is never stored by the browser or a proxy
@login_required
@require_http_methods(["GET", "POST"])
def token_list(request):
    """Your tokens and the create form; a created token's secret is shown in this response only."""
    rule = user_lifetimes(request.user)
    context = {"tokens": _tokens(request.user), "expiry_choices": expiry_choices(rule), "lifetimes": rule,
               "errors": {}, "values": {}}
    if request.method == "GET":
        return render_page(request, "tokens/list.html", context)
    name = request.POST.get("name", "").strip()
    if not name:
        context |= {"errors": {"name": ["Give the token a name, e.g. the script or CI job that uses it."]},
                    "values": request.POST.dict()}
        return render_page(request, "tokens/list.html", context, status=400)
    try:
        token, raw = access_token_create(user=request.user, name=name,
                                         expires_at=expiry_from_form(request.POST.get("expires_in_days", "")))
    except ActionError as e:
        context |= {"errors": {e.field or "name": [e.message]}, "values": request.POST.dict()}
        return render_page(request, "tokens/list.html", context, status=400)
    context |= {"created": token, "secret": raw, "tokens": _tokens(request.user)}
    return render_page(request, "tokens/list.html", context, status=201)


@login_required
@require_http_methods(["GET", "POST"])
def token_revoke(request, pk: int):
    """Confirm, then revoke one of your tokens."""
    token = get_object_or_404(AccessToken, pk=pk, user=request.user)
    if request.method == "POST":
        access_token_revoke(user=request.user, token=token)
        messages.success(request, f"Revoked {token.name} ({token.display}).")
        return redirect("frontend:tokens")
    return render_page(request, "keys/revoke.html", {"key": token, "kind": "access token", "gateway": False,
                                                     "back": "frontend:tokens"})
