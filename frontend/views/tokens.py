"""Personal access tokens for the REST API: list, create (secret shown once), revoke with confirmation."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_http_methods

from deployments.models import AccessToken
from deployments.services.credentials import credential_mint, credential_revoke
from deployments.services.events import event_record
from frontend.views.base import render_page
from frontend.views.keys import EXPIRY_CHOICES, _expiry


def _tokens(user):
    return AccessToken.objects.filter(user=user).order_by("revoked_at", "-created_at")


@transaction.atomic
def _create(user, name: str, expires_at):
    # Same steps as the REST API's token endpoint (deployments/api/views.py): there is no token service yet.
    token, raw = credential_mint(model=AccessToken, user=user, name=name, expires_at=expires_at)
    event_record(kind="access_token_created", actor=user, after={"name": token.name, "key_id": token.key_id})
    return token, raw


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request):
    """Your tokens and the create form; a created token's secret is shown in this response only."""
    context = {"tokens": _tokens(request.user), "expiry_choices": EXPIRY_CHOICES, "errors": {}, "values": {}}
    if request.method == "GET":
        return render_page(request, "tokens/list.html", context)
    name = request.POST.get("name", "").strip()
    if not name:
        context |= {"errors": {"name": ["Give the token a name, e.g. the script or CI job that uses it."]},
                    "values": request.POST.dict()}
        return render_page(request, "tokens/list.html", context, status=400)
    token, raw = _create(request.user, name, _expiry(request.POST.get("expires_in_days", "")))
    context |= {"created": token, "secret": raw, "tokens": _tokens(request.user)}
    return render_page(request, "tokens/list.html", context, status=201)


@login_required
@require_http_methods(["GET", "POST"])
def token_revoke(request, pk: int):
    """Confirm, then revoke one of your tokens."""
    token = get_object_or_404(AccessToken, pk=pk, user=request.user)
    if request.method == "POST":
        if credential_revoke(row=token):
            event_record(kind="access_token_revoked", actor=request.user, before={"key_id": token.key_id})
        messages.success(request, f"Revoked {token.name} (tdp_{token.key_id}…{token.last4}).")
        return redirect("frontend:tokens")
    return render_page(request, "keys/revoke.html", {"key": token, "kind": "access token", "prefix": "tdp",
                                                     "back": "frontend:tokens"})
