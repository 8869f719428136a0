"""Rollouts of an update to a running deployment: started by the update's own write, moved by the reconciler
(workers.rollout), paused, resumed or aborted by an admin. The only writer of `Rollout` rows.

An update whose generations can share KV (deployments.generations) rolls in place; one that cannot runs side by
side, the gateway moving traffic to it in the spec's steps (deployments.models.Rollout).
"""
from django.db import transaction
from django.utils import timezone

from deployments.errors import Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.generations import kv_verdict
from deployments.lifecycle import ROLLOUT_ENDS, Status
from deployments.models import Deployment, Rollout
from deployments.permissions import deployment_may_decide
from deployments.services.events import event_record
from deployments.services.spec_store import deployment_spec_set
from deployments.services.status import deployment_reconcile_request
from deployments.spec import STAGES, DeploymentSpec
from deployments.surge import Surge, rollout_surge


def rollout_active(deployment: Deployment) -> Rollout | None:
    """The deployment's rollout in progress, if any (at most one: a constraint)."""
    return deployment.rollouts.filter(state__in=Rollout.ACTIVE).first()


def rollout_require_none(deployment: Deployment) -> None:
    """An update is refused while another is rolling out: two new generations at once would mix."""
    if (r := rollout_active(deployment)) is not None:
        where = (f"{r.state}, {r.weight}% of requests" if r.mode == Rollout.Mode.SIDE_BY_SIDE else "in place")
        raise Conflict(f"Generation {r.to_generation} is still rolling out ({where}). Wait until it is done, or "
                       "abort it, then update again.")


def _mode(verdict) -> str:
    """How an update with this compatibility verdict rolls out: in place when the generations can share KV."""
    return Rollout.Mode.IN_PLACE if verdict.compatible else Rollout.Mode.SIDE_BY_SIDE


def rollout_surge_needed(*, deployment: Deployment, old_spec: DeploymentSpec, new_spec: DeploymentSpec) -> Surge | None:
    """The surge an update about to be made to `deployment` will hold while it rolls out: a running deployment's
    update that runs side by side (rollout_begin); None for any other."""
    if deployment.status != Status.RUNNING or _mode(kv_verdict(old_spec, new_spec)) != Rollout.Mode.SIDE_BY_SIDE:
        return None
    return rollout_surge(new_spec, target_kind=deployment.cluster.kind)


def rollout_surge_held(deployment: Deployment) -> Surge | None:
    """What the deployment holds beyond its spec now: its side-by-side rollout's surge while one is in progress."""
    if not deployment.rollouts.filter(state__in=Rollout.ACTIVE, mode=Rollout.Mode.SIDE_BY_SIDE).exists():
        return None
    return rollout_surge(deployment.spec_typed, target_kind=deployment.cluster.kind)


def rollout_begin(*, deployment: Deployment, old_spec: DeploymentSpec, new_spec: DeploymentSpec, actor=None
                  ) -> Rollout:
    """Record how the update about to run (`deployment.generation`, already the new one) reaches users, in the
    update's own transaction, with the compatibility verdict and its reasons."""
    d = deployment
    verdict = kv_verdict(old_spec, new_spec)
    mode = _mode(verdict)
    old = {stage: old_spec.pool(stage).replicas_min for stage in STAGES}
    r = Rollout.objects.create(
        deployment=d, from_generation=d.endpoint_generation or d.observed_generation or d.generation - 1,
        to_generation=d.generation, from_spec=old_spec.to_dict(), from_app=d.app_generation,
        to_app=d.generation if mode == Rollout.Mode.SIDE_BY_SIDE else d.app_generation, mode=mode,
        verdict=verdict.as_dict(), step_weights=list(new_spec.rollout.steps), replicas={"old": old, "new": {stage: 0 for stage in STAGES}},
        peak_surge={stage: 0 for stage in STAGES}, step_started_at=timezone.now())
    how = ("rolls in place, replica by replica: the generations can share KV" if verdict.compatible else
           "runs side by side and takes traffic in steps of " + ", ".join(f"{w}%" for w in new_spec.rollout.steps)
           + f" with at most {new_spec.rollout.max_surge} extra replica(s) per pool: " + "; ".join(verdict.reasons))
    event_record(kind=EventKind.ROLLOUT_STARTED, deployment=d, actor=actor,
                 message=f"Generation {r.to_generation} {how}.",
                 after={"rollout": r.pk, "mode": mode, "verdict": r.verdict})
    return r


def _require_admin(*, actor, rollout: Rollout) -> None:
    if not deployment_may_decide(user=actor, deployment=rollout.deployment):
        raise NotAllowed("Only an admin of the deployment's team may pause, resume or abort its rollout.")


def _locked(rollout: Rollout) -> Rollout:
    r = Rollout.objects.select_for_update().select_related("deployment__team", "deployment__cluster").get(
        pk=rollout.pk)
    if not r.active:
        raise Conflict(f"The rollout of generation {r.to_generation} is {r.state}: nothing to change.")
    return r


@transaction.atomic
def rollout_pause(*, actor, rollout: Rollout) -> Rollout:
    """Hold the rollout at its current step: traffic stays split as it is until it is resumed or aborted."""
    r = _locked(rollout)
    _require_admin(actor=actor, rollout=r)
    if r.mode != Rollout.Mode.SIDE_BY_SIDE:
        raise Conflict("An update rolling in place cannot be paused; abort it to roll back instead.")
    if r.state == Rollout.State.ROLLING_BACK:  # held there, the old generation would never serve alone again
        raise Conflict(f"Generation {r.to_generation} is rolling back already: nothing to pause.")
    if not r.paused:
        Rollout.objects.filter(pk=r.pk).update(paused=True)
        r.paused = True
        event_record(kind=EventKind.ROLLOUT_PAUSED, deployment=r.deployment, actor=actor,
                     message=f"Held at {r.weight}% of requests on generation {r.to_generation}.")
    return r


@transaction.atomic
def rollout_resume(*, actor, rollout: Rollout) -> Rollout:
    r = _locked(rollout)
    _require_admin(actor=actor, rollout=r)
    if r.paused:
        now = timezone.now()
        Rollout.objects.filter(pk=r.pk).update(paused=False, step_started_at=now)
        r.paused, r.step_started_at = False, now
        event_record(kind=EventKind.ROLLOUT_RESUMED, deployment=r.deployment, actor=actor,
                     message=f"Goes on from {r.weight}% of requests on generation {r.to_generation}; this step is "
                             "watched again from now.")
        transaction.on_commit(lambda: deployment_reconcile_request(deployment_id=r.deployment_id))
    return r


@transaction.atomic
def rollout_abort(*, actor, rollout: Rollout, reason: str = "") -> Rollout:
    """Move every request back to the old generation and remove the new one (the reconciler does it)."""
    r = _locked(rollout)
    _require_admin(actor=actor, rollout=r)
    if r.state != Rollout.State.ROLLING_BACK:
        why = reason.strip() or "no reason given"
        Rollout.objects.filter(pk=r.pk).update(state=Rollout.State.ROLLING_BACK, paused=False,
                                               reason=f"Aborted by {actor.get_username()}: {why}")
        r.state = Rollout.State.ROLLING_BACK
        event_record(kind=EventKind.ROLLOUT_ABORTED, deployment=r.deployment, actor=actor,
                     message=f"Every request goes back to generation {r.from_generation}; generation "
                             f"{r.to_generation} is removed. Reason: {why}")
        transaction.on_commit(lambda: deployment_reconcile_request(deployment_id=r.deployment_id))
    return r


def rollout_end_by_status(*, deployment: Deployment, actor=None) -> None:
    """A deployment paused, deleted or failed while it rolls out: the rollout ends there (what runs of either
    generation goes with the deployment's own teardown; a failure is retried from its spec as a new deployment)."""
    if deployment.status not in ROLLOUT_ENDS:
        return
    r = rollout_active(deployment)
    if r is None:
        return
    Rollout.objects.filter(pk=r.pk).update(state=Rollout.State.ABORTED, finished_at=timezone.now(),
                                           reason=f"The deployment is {deployment.status}.")
    event_record(kind=EventKind.ROLLOUT_ABORTED, deployment=deployment, actor=actor,
                 message=f"The rollout of generation {r.to_generation} ended: the deployment is {deployment.status}.")


@transaction.atomic
def rollout_spec_restore(*, rollout: Rollout, old_spec: DeploymentSpec) -> Deployment:
    """A rolled-back update: the deployment's spec is the old generation's again, at the next generation (they
    only count up), recorded as an update by Tandem with the rollout's reason."""
    d = Deployment.objects.select_for_update().select_related("team", "cluster").get(pk=rollout.deployment_id)
    before = d.spec
    fields = deployment_spec_set(deployment=d, spec=old_spec)
    d.generation += 1
    d.save(update_fields=[*fields, "generation", "updated_at"])
    event_record(kind=EventKind.UPDATED, deployment=d, before={"spec": before}, after={"spec": d.spec},
                 message=f"Generation {rollout.to_generation} was rolled back; generation {d.generation} runs "
                         f"generation {rollout.from_generation}'s spec again. {rollout.reason}")
    return d


def rollout_record(*, rollout: Rollout, **fields) -> None:
    """The reconciler's write of what the rollout did (state, step, weight, replicas, peaks, log): only what
    changed, and never over an admin's abort (a pass that read `shifting` must not write it back)."""
    changed = {k: v for k, v in fields.items() if getattr(rollout, k) != v}
    if not changed:
        return
    query = Rollout.objects.filter(pk=rollout.pk)
    if "state" in changed and changed["state"] != Rollout.State.ROLLING_BACK and \
            rollout.state != Rollout.State.ROLLING_BACK:
        query = query.exclude(state=Rollout.State.ROLLING_BACK)
    if query.update(**changed):
        for k, v in changed.items():
            setattr(rollout, k, v)
