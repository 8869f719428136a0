"""The request form: create or change a deployment, with inline validation and a live plan (htmx)."""
from django.contrib.auth.decorators import login_required
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from deployments import selectors
from deployments.cost import ON_DEMAND, cluster_prices
from deployments.errors import ActionError
from deployments.lifecycle import EDITABLE
from deployments.model_sources import source_roots_of
from deployments.models import Cluster
from deployments.outcomes import Outcome
from deployments.services import actions
from deployments.spec import SpecError, name_errors, spec_parse
from frontend import planning, spec_form
from frontend.views.base import render_page, require_team, team_required
from observability.selectors import fleet_reader



def _clusters():
    return Cluster.objects.order_by("name")


def _roots(team, data):
    """The model sources the form's cluster allows the team (None until a cluster is picked)."""
    cluster = _clusters().filter(name=data.get("cluster", "")).first()
    return source_roots_of(cluster=cluster, team=team) if cluster else None


def _check(data, *, with_name: bool, team) -> tuple[dict, dict[str, list[str]]]:
    """The request-shaped spec from the form and every error the validator finds, by dotted path."""
    spec = spec_form.spec_from_form(data)
    errors: dict[str, list[str]] = {}
    if with_name and (problems := name_errors(data.get("name", "").strip())):
        errors["name"] = problems
    cluster = _clusters().filter(name=data.get("cluster", "")).first()
    if with_name and cluster is None:
        errors["cluster"] = ["Pick the cluster to deploy on."]
    try:
        spec_parse(spec, target_kind=cluster.kind if cluster else None, source_roots=_roots(team, data))
    except SpecError as e:
        errors |= {f"spec.{k}": v for k, v in e.errors.items()}
    return spec, errors


def _plan_context(*, team, spec: dict, data, user, exclude_id=None) -> dict:
    cluster = _clusters().filter(name=data.get("cluster", "")).first()
    kind, prices = (cluster.kind, cluster_prices(cluster)) if cluster else ("", ON_DEMAND)
    plan, note = planning.plan(spec, spec_form.facts_from_form(data), source_roots=_roots(team, data),
                               fleet=fleet_reader(user=user, now=timezone.now()), prices=prices)
    return {"plan": plan, "plan_note": note, "cost": planning.hourly_cost(spec, prices=prices),
            "quota": planning.quota_view(team=team, gpus=planning.gpus_of(spec, target_kind=kind),
                                         exclude_id=exclude_id,
                                         basis=planning.quota_basis_of(spec, target_kind=kind))}


def _form_context(*, team, user, values: dict, errors: dict | None = None, other_errors=(), d=None) -> dict:
    by_field, other = spec_form.errors_by_field(errors or {})
    spec = spec_form.spec_from_form(values)
    return {
        "team": team, "values": values, "errors": by_field, "other_errors": [*other_errors, *other], "d": d,
        "clusters": _clusters(), "fields": spec_form, "instance_gpus": spec_form.instance_gpus(),
        **_plan_context(team=team, spec=spec, data=values, user=user, exclude_id=d.pk if d else None),
    }


@login_required
@require_http_methods(["GET", "POST"])
@team_required
def deployment_new(request):
    """Ask for a deployment: every spec field, defaults per instance type, plan and quota before submitting."""
    team = require_team(request)
    if request.method == "GET":
        values = spec_form.default_values()
        values["cluster"] = request.GET.get("cluster") or (_clusters().values_list("name", flat=True).first() or "")
        return render_page(request, "deployments/form.html",
                           _form_context(team=team, user=request.user, values=values))
    values = request.POST.dict()
    spec, errors = _check(request.POST, with_name=True, team=team)
    other: list[str] = []
    if not errors:
        try:
            d = actions.deployment_request(
                actor=request.user, team=team, cluster=_clusters().get(name=values["cluster"]),
                name=values["name"].strip(), spec=spec, purpose=values.get("purpose", "").strip())
        except SpecError as e:
            errors = e.errors
        except ActionError as e:
            errors, other = ({e.field: [e.message]}, []) if e.field else ({}, [e.message])
        else:
            messages.success(request, f"Requested {d.name}. An admin of {team.name} will review it.")
            return redirect("frontend:deployment-detail", pk=d.pk)
    context = _form_context(team=team, user=request.user, values=values, errors=errors, other_errors=other)
    return render_page(request, "deployments/form.html", context, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def deployment_edit(request, pk: int):
    """Edit a pending request, or update a running/failed one (a change to what costs or what an approver judged
    goes back to approval)."""
    d = get_object_or_404(selectors.deployments_visible_to(request.user), pk=pk)
    if d.status not in EDITABLE:
        messages.error(request, f"A {d.get_status_display().lower()} deployment cannot be changed.")
        return redirect("frontend:deployment-detail", pk=d.pk)
    if request.method == "GET":
        values = spec_form.values_from_spec(d.spec_typed) | {"name": d.name, "cluster": d.cluster.name,
                                                       "purpose": d.purpose}
        return render_page(request, "deployments/form.html",
                           _form_context(team=d.team, user=request.user, values=values, d=d))
    values = request.POST.dict() | {"name": d.name, "cluster": d.cluster.name}
    spec, errors = _check(values, with_name=False, team=d.team)
    other: list[str] = []
    if not errors:
        try:
            done = actions.deployment_update(actor=request.user, deployment=d, spec=spec,
                                             purpose=values.get("purpose", "").strip())
        except SpecError as e:
            errors = {f"spec.{k}": v for k, v in e.errors.items()}
        except ActionError as e:
            other = [e.message]
        else:
            if done.outcome == Outcome.PROPOSED:
                messages.success(request, f"Proposed an update of {d.name}: it waits for an admin's approval; "
                                          "the approved spec keeps running until then.")
            else:
                messages.success(request, f"Saved changes to {d.name}.")
            return redirect("frontend:deployment-detail", pk=d.pk)
    context = _form_context(team=d.team, user=request.user, values=values, errors=errors, other_errors=other,
                            d=d)
    return render_page(request, "deployments/form.html", context, status=400)


@login_required
@require_POST
@team_required
def deployment_validate(request):
    """htmx: validate the form as the user types; answers the plan panel plus out-of-band error slots."""
    team = require_team(request)
    editing = request.POST.get("editing_id")
    d = get_object_or_404(selectors.deployments_visible_to(request.user), pk=editing) if editing else None
    values = request.POST.dict()
    if d is not None:
        values |= {"name": d.name, "cluster": d.cluster.name}
        team = d.team
    spec, errors = _check(values, with_name=d is None, team=team)
    context = _form_context(team=team, user=request.user, values=values, errors=errors, d=d)
    # A blank field is one the user has not reached yet: say nothing about it until they submit.
    context["errors"] = {k: v for k, v in context["errors"].items() if values.get(k, "").strip()}
    context["slots"] = spec_form.ALL_FIELD_NAMES
    return render_page(request, "deployments/form.html#validation", context)
