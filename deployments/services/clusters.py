"""Registering targets (platform admins only)."""
from django.db import transaction

from deployments.errors import ActionError, Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import Cluster
from deployments.secret_refs import secret_ref_errors
from deployments.services.cluster_checks import cluster_check_request
from deployments.services.events import event_record
from deployments.services.teams import is_platform_admin


@transaction.atomic
def cluster_register(*, actor, name: str, kind: str, config: dict | None = None, secret_ref: str = "") -> Cluster:
    """Register a target under a unique name; `config` holds only non-secret settings. Its preflight starts."""
    config = config or {}
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can register clusters.")
    if problems := secret_ref_errors(secret_ref):  # the API and the admin check it first; this is the rule
        raise ActionError(" ".join(problems), field="secret_ref")
    if Cluster.objects.filter(name=name).exists():
        raise Conflict(f"A cluster named {name!r} already exists.", field="name")
    cluster = Cluster.objects.create(name=name, kind=kind, config=config, secret_ref=secret_ref)
    # The secret reference is a name, not a secret, but the audit trail does not need it either.
    event_record(kind=EventKind.CLUSTER_REGISTERED, actor=actor, after={"name": name, "kind": kind, "config": config})
    cluster_check_request(actor=actor, cluster=cluster)  # the preflight runs as soon as the worker can reach it
    return cluster
