"""Team API keys for the gateway: list, create (secret shown once), revoke with confirmation."""
import datetime as dt

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from deployments import selectors
from deployments.errors import ActionError
from deployments.lifecycle import LIVE
from deployments.permissions import api_key_may_manage, team_is_admin
from deployments.services import api_keys
from deployments.services.credentials import Lifetimes, team_lifetimes
from frontend.views.base import render_page, require_team, team_required

EXPIRY_DAYS = [(7, "7 days"), (30, "30 days"), (90, "90 days"), (365, "1 year")]


def expiry_choices(rule: Lifetimes) -> list[tuple[str, str]]:
    """The default first, then the fixed lifetimes the rule allows (the service refuses longer ones anyway)."""
    return [("", f"Default ({rule.default_days} days)")] + [
        (str(days), label) for days, label in EXPIRY_DAYS if days <= rule.max_days]


def expiry_from_form(days: str):
    """The expiry a form asks for; blank is the rule's default (the service applies it)."""
    return timezone.now() + dt.timedelta(days=int(days)) if days.isdigit() else None


def _limit(raw: str, field: str, errors: dict):
    raw = raw.strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        errors[field] = ["A whole number above zero, or blank for no limit."]
        return None
    return int(raw)


def _page(request, team, *, created=None, secret=None, errors=None, values=None, status=200):
    keys = selectors.api_keys_visible_to(request.user).filter(team=team).order_by("revoked_at", "-created_at")
    deployments = selectors.deployments_visible_to(request.user).filter(team=team, status__in=LIVE)
    is_admin = team_is_admin(user=request.user, team=team)
    rule = team_lifetimes(team)
    return render_page(request, "keys/list.html", {
        "team": team, "keys": keys, "created": created, "secret": secret, "errors": errors or {},
        "values": values or {"scope": "all"}, "deployments": deployments, "expiry_choices": expiry_choices(rule),
        "lifetimes": rule, "now": timezone.now(), "is_admin": is_admin,
        "manageable": {k.pk for k in keys if api_key_may_manage(user=request.user, key=k, team_admin=is_admin)},
    }, status=status)


@never_cache  # the page that shows a new secret is never stored by the browser or a proxy
@login_required
@require_http_methods(["GET", "POST"])
@team_required
def api_key_list(request):
    """The team's keys, and the create form; a created key's secret is shown in this response only."""
    team = require_team(request)
    if request.method == "GET":
        return _page(request, team)
    values = request.POST.dict()
    errors: dict[str, list[str]] = {}
    name = values.get("name", "").strip()
    if not name:
        errors["name"] = ["Give the key a name you will recognise, e.g. the service that uses it."]
    rpm = _limit(values.get("requests_per_minute", ""), "requests_per_minute", errors)
    tpm = _limit(values.get("tokens_per_minute", ""), "tokens_per_minute", errors)
    scoped = values.get("scope") == "selected"
    chosen = api_keys.deployments_for_scope(team=team, ids=[i for i in request.POST.getlist("deployments")
                                                            if i.isdigit()])
    if not errors:
        try:
            key, secret = api_keys.api_key_create(
                actor=request.user, team=team, name=name, team_key=values.get("owner") == "team",
                all_deployments=not scoped, deployments=chosen,
                expires_at=expiry_from_form(values.get("expires_in_days", "")), requests_per_minute=rpm,
                tokens_per_minute=tpm)
        except ActionError as e:
            errors[e.field or "name"] = [e.message]
        else:
            return _page(request, team, created=key, secret=secret, status=201)
    return _page(request, team, errors=errors, values=values, status=400)


@login_required
@require_POST
def api_key_transfer(request, pk: int):
    """Make a person's key a team key (team admins), so it stays when they leave."""
    key = get_object_or_404(selectors.api_keys_visible_to(request.user), pk=pk)
    try:
        api_keys.api_key_transfer_to_team(actor=request.user, key=key, message="Moved to the team in the portal.")
    except ActionError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, f"{key.name} ({key.display}) is now a key of {key.team.name}: it stays when people "
                                  "leave.")
    return redirect("frontend:api-keys")


@login_required
@require_http_methods(["GET", "POST"])
def api_key_revoke(request, pk: int):
    """Confirm, then revoke a key (its owner or a team admin): every gateway replica refuses it within a
    second."""
    key = get_object_or_404(selectors.api_keys_visible_to(request.user), pk=pk)
    if request.method == "POST":
        try:
            api_keys.api_key_revoke(actor=request.user, key=key)
        except ActionError as e:
            messages.error(request, e.message)
        else:
            messages.success(request, f"Revoked {key.name} ({key.display}).")
        return redirect("frontend:api-keys")
    return render_page(request, "keys/revoke.html", {"key": key, "team": key.team, "kind": "API key",
                                                     "gateway": True, "back": "frontend:api-keys"})
