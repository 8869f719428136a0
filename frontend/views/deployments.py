"""Deployment pages: the list, the detail page with its live status panel, and the lifecycle actions."""
import datetime as dt

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling

from deployments import selectors
from deployments.conditions import CONDITION_TYPES, condition_get
from deployments.cost import cluster_prices
from deployments.errors import ActionError
from deployments.lifecycle import PAUSABLE, Status
from deployments.model_sources import source_roots_of
from deployments.models import Cluster
from deployments.permissions import deployment_may_change
from deployments.quota_rules import quota_gpus
from deployments.services import actions
from deployments.spec import spec_load
from frontend import planning
from frontend.rollout_panel import rollouts_context
from frontend.views.advice import targets_context
from frontend.views.base import render_page, require_team, team_required
from frontend.views.status import deployment_state, timeline
from usage.selectors import deployment_cost
from observability.selectors import fleet_reader

LIST_PAGE_SIZE = 50
STATUS_FILTERS = [("", "Any status")] + [(s.value, s.label) for s in Status]


@login_required
@team_required
def deployment_list(request):
    """The current team's deployments, newest first, a page at a time, filtered by status and cluster and searched
    by name or model."""
    team = require_team(request)
    qs = selectors.deployments_visible_to(request.user).filter(team=team)
    status, cluster, q = (request.GET.get(k, "").strip() for k in ("status", "cluster", "q"))
    if status:
        qs = qs.filter(status=status)
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    if q:
        qs = qs.filter(Q(name__icontains=q) | Q(model_id__icontains=q))
    page = Paginator(qs.order_by("-created_at", "-id"), LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"d": d, "gpus": d.quota_gpus} for d in page]
    context = {
        "team": team, "rows": rows, "page": page, "filters": {"status": status, "cluster": cluster, "q": q},
        "filtered": bool(status or cluster or q), "status_choices": STATUS_FILTERS,
        "clusters": Cluster.objects.order_by("name").values_list("name", flat=True),
    }
    if request.htmx and request.htmx.target == "deployment-table":
        return render_page(request, "deployments/list.html#deployment-table", context)
    return render_page(request, "deployments/list.html", context)


def _visible(request, pk: int):
    return get_object_or_404(selectors.deployments_visible_to(request.user), pk=pk)


def _status_context(d, user) -> dict:
    conditions = {c.get("type"): c for c in d.conditions or []}
    serve = conditions.get("ServeRunning") or {}
    # What the cluster reports wrong, each stage's cause on a line of its own (workers.diagnosis), in full: the
    # conditions' cards show only the start of a message.
    not_serving = (serve.get("message") or "").splitlines() if serve.get("status") == "False" and \
        serve.get("reason") != "Paused" else []
    return {
        "d": d, "state": deployment_state(d), "timeline": timeline(d), "can_pause": d.status in PAUSABLE,
        "conditions": [conditions.get(t) or {"type": t, "status": "Unknown"} for t in CONDITION_TYPES],
        "not_serving": not_serving,
    } | rollouts_context(user=user, deployment=d)


@login_required
def deployment_detail(request, pk: int):
    """One deployment: status, live timeline, endpoint and snippets, health, latency, usage, audit trail."""
    d = _visible(request, pk)
    plan, plan_note = planning.plan_for_stored(d.spec_typed,
                                               source_roots=source_roots_of(cluster=d.cluster, team=d.team),
                                               fleet=fleet_reader(user=request.user, now=timezone.now()),
                                               prices=cluster_prices(d.cluster))
    context = _status_context(d, request.user) | {
        "team": d.team, "gpus": d.quota_gpus, "gateway_base_url": settings.TANDEM_GATEWAY_BASE_URL,
        "endpoint_ready": condition_get(d.conditions, "EndpointReady") or {},
        "plan": plan, "plan_note": plan_note, "kv_observed": planning.kv_observed(d.conformance_runs.first()),
        "audit": d.events.select_related("actor").order_by("-created_at", "-id"),
        "can_edit": deployment_may_change(user=request.user, deployment=d),
        "cost": deployment_cost(deployment=d, window=dt.timedelta(days=1)),
        "proposed_gpus": quota_gpus(spec_load(d.proposed_spec), target_kind=d.cluster.kind) if d.proposed_spec
        else None,
    } | targets_context(request, d)
    return render_page(request, "deployments/detail.html", context)


@login_required
def deployment_status(request, pk: int):
    """The status panel alone, polled by htmx while the deployment is in flight; 286 stops the polling."""
    d = _visible(request, pk)
    if not request.htmx:
        return redirect("frontend:deployment-detail", pk=d.pk)
    context = _status_context(d, request.user) | {
        "oob": True, "can_edit": deployment_may_change(user=request.user, deployment=d)}
    response = render_page(request, "deployments/detail.html#status-panel", context)
    if context["state"]["settled"]:
        return HttpResponseStopPolling(response.content)
    return response


def _act(request, d, action, done: str):
    try:
        action()
    except ActionError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, done)
    nxt = request.POST.get("next", "")
    if nxt and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        return redirect(nxt)
    return redirect("frontend:deployment-detail", pk=d.pk)


def _decision(request) -> dict:
    """What the approver reviewed, from the queue form's hidden fields (a missing or mangled generation can
    match nothing, so the service answers that the request changed)."""
    generation = request.POST.get("generation", "")
    return {"generation": int(generation) if generation.isdigit() else 0,
            "proposed_hash": request.POST.get("proposed_spec_hash", "").strip() or None,
            "comment": request.POST.get("comment", "").strip()}


@login_required
@require_POST
def deployment_approve(request, pk: int):
    """Approve the request or proposed update shown in the queue, with an optional comment."""
    d = _visible(request, pk)
    decision = _decision(request)
    return _act(request, d, lambda: actions.deployment_approve(actor=request.user, deployment=d, **decision),
                f"Approved {d.name}.")


@login_required
@require_POST
def deployment_reject(request, pk: int):
    """Reject the request or proposed update shown in the queue; the comment is what the requester sees."""
    d = _visible(request, pk)
    decision = _decision(request)
    return _act(request, d, lambda: actions.deployment_reject(actor=request.user, deployment=d, **decision),
                f"Rejected {d.name}.")


@login_required
@require_POST
def deployment_withdraw(request, pk: int):
    """The requester takes back a pending request or proposed update."""
    d = _visible(request, pk)
    return _act(request, d, lambda: actions.deployment_withdraw(actor=request.user, deployment=d),
                f"Withdrew {d.name}.")


@login_required
@require_POST
def deployment_retry(request, pk: int):
    """Start a failed deployment again."""
    d = _visible(request, pk)
    return _act(request, d, lambda: actions.deployment_retry(actor=request.user, deployment=d),
                f"Retrying {d.name}.")


@login_required
@require_http_methods(["GET", "POST"])
def deployment_delete(request, pk: int):
    """Confirm, then tear the deployment down (a pending request is withdrawn)."""
    d = _visible(request, pk)
    if request.method == "POST":
        if request.POST.get("confirm_name", "").strip() != d.name:
            return render_page(request, "deployments/delete.html",
                               {"d": d, "team": d.team, "gpus": d.quota_gpus,
                                "error": f"Type {d.name} to confirm."}, status=400)
        return _act(request, d, lambda: actions.deployment_delete(actor=request.user, deployment=d),
                    f"Deleting {d.name}: its GPUs are freed once teardown finishes.")
    return render_page(request, "deployments/delete.html", {"d": d, "team": d.team, "gpus": d.quota_gpus})
