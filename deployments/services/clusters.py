"""Registering and editing targets (platform admins only)."""
from django.db import transaction

from deployments.cluster_config import cluster_config_errors
from deployments.errors import ActionError, Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import Cluster
from deployments.permissions import is_platform_admin
from deployments.secret_refs import secret_ref_errors
from deployments.services.cluster_checks import cluster_check_request
from deployments.services.events import event_record
from deployments.services.spec_store import cluster_deployments_reprice


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


@transaction.atomic
def cluster_update(*, actor, cluster: Cluster, config: dict | None = None, secret_ref: str | None = None) -> Cluster:
    """Replace a cluster's config and/or secret reference (None leaves it as it is); its name and kind stay. The
    preflight runs again; deployments on it keep running and their next reconcile pass reads the new config."""
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can edit clusters.")
    # Compare with the stored row, not the caller's object: a form may have set the new values on it already.
    cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
    if config is not None and (errors := cluster_config_errors(cluster.kind, config)):
        raise ActionError(" ".join(errors), field="config")
    if secret_ref is not None and (problems := secret_ref_errors(secret_ref)):
        raise ActionError(" ".join(problems), field="secret_ref")
    changes = {k: v for k, v in (("config", config), ("secret_ref", secret_ref))
               if v is not None and getattr(cluster, k) != v}
    if not changes:
        return cluster
    before, after = {"name": cluster.name}, {"name": cluster.name}
    if "config" in changes:
        before["config"], after["config"] = cluster.config, changes["config"]
    if "secret_ref" in changes:  # that it changed, never the reference itself
        before["has_secret"], after["has_secret"] = bool(cluster.secret_ref), bool(changes["secret_ref"])
    for k, v in changes.items():
        setattr(cluster, k, v)
    cluster.save(update_fields=list(changes))
    if "config" in changes:  # its `prices` may have changed: what its deployments cost an hour follows them
        cluster_deployments_reprice(cluster=cluster)
    event_record(kind=EventKind.CLUSTER_UPDATED, actor=actor, before=before, after=after,
                 message="Secret reference changed." if "secret_ref" in changes else "")
    cluster_check_request(actor=actor, cluster=cluster)  # the preflight reruns against the new settings
    return cluster
