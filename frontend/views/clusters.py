"""A cluster's page (platform admins): its kind and the latest preflight, each check with evidence and fix, and a
button that runs the checks again; the results panel polls itself while a run is in flight."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from deployments import selectors
from deployments.errors import ActionError
from deployments.models import Cluster, ClusterCheck
from deployments.permissions import is_platform_admin
from deployments.services.cluster_checks import cluster_check_request
from frontend.views.base import render_page


def _cluster(request, name: str) -> Cluster:
    if not is_platform_admin(request.user):
        raise Http404("No such cluster.")  # members see clusters by name only, in the request form
    return get_object_or_404(Cluster, name=name)


def _context(cluster: Cluster) -> dict:
    run = selectors.cluster_check_latest(cluster)
    lines = list(run.lines.all()) if run else []
    return {"cluster": cluster, "run": run, "lines": lines,
            "failed": sum(line.status == "fail" for line in lines),
            "running": run is not None and run.status == ClusterCheck.Status.RUNNING}


@login_required
def cluster_detail(request, name: str):
    """The cluster and its latest checks."""
    return render_page(request, "clusters/detail.html", _context(_cluster(request, name)))


@login_required
def cluster_checks_panel(request, name: str):
    """The checks panel alone, polled by htmx while a run is in flight; 286 stops the polling."""
    cluster = _cluster(request, name)
    if not request.htmx:
        return redirect("frontend:cluster-detail", name=cluster.name)
    context = _context(cluster)
    response = render_page(request, "clusters/detail.html#checks-panel", context)
    return response if context["running"] else HttpResponseStopPolling(response.content)


@login_required
@require_POST
def cluster_check(request, name: str):
    """The **Run checks** button: start a preflight run; the page shows it as it finishes."""
    cluster = _cluster(request, name)
    try:
        cluster_check_request(actor=request.user, cluster=cluster)
    except ActionError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, f"Checking {cluster.name}; the results appear below.")
    if request.htmx:
        return render_page(request, "clusters/detail.html#checks-panel", _context(cluster))
    return redirect("frontend:cluster-detail", name=cluster.name)
