"""One reconcile pass, step by step. See workers.reconcile for the contract."""
import datetime as dt
import logging
import random
import time

from django.conf import settings
from django.utils import timezone

from deployments.conditions import condition_set, conformance_passed, endpoint_ready
from deployments.errors import StatusMoved
from deployments.event_kinds import EventKind
from deployments.lifecycle import PROGRESSING, SETTLED, Status
from deployments.model_sources import source_roots_of
from deployments.models import Deployment
from deployments.redaction import internal_redact
from deployments.services.events import event_record
from deployments.services.actions import deployment_transition
from deployments.services.status import deployment_observe
from deployments.spend import deployment_ready_estimate
from deployments.spec import SpecError, spec_check
from observability.models import ConformanceRun
from observability.tasks import run_conformance
from workers.targets import target_for
from workers.targets.base import PermanentError, Step, TransientError

log = logging.getLogger(__name__)
MAX_BACKOFF = 60.0
# How fresh `serving_seen_at` is kept while a deployment serves (`./tandem up` waits for a reading after its start).
SERVING_SEEN_EVERY = dt.timedelta(seconds=30)


class LockLost(Exception):
    """The pass no longer holds the deployment's reconcile lock (workers.reconcile): it must not touch the target."""


class _Pass:
    """State for one pass: the deployment, the conditions it sets and the step events."""

    def __init__(self, d: Deployment, fence):
        self.d = d
        self.fence = fence  # raises LockLost; run before each step, since steps call the target
        self.updates: dict[str, dict] = {}  # the conditions this pass set, merged into the row when written

    def cond(self, type, ok, reason, message=""):
        self.updates[type] = {"status": ok, "reason": reason, "message": message, "generation": self.d.generation}

    def step(self, kind: EventKind, fn):
        """Run one step; write an event with its duration when its outcome differs from the last one."""
        self.fence()
        started = time.monotonic()
        result = fn()
        ms = int((time.monotonic() - started) * 1000)
        self.note(kind, getattr(result, "message", "") or "", duration_ms=ms)
        return result

    def note(self, kind: EventKind, message: str, *, duration_ms: int | None = None) -> None:
        """Record an event unless the last event of this kind said the same (passes repeat; events do not)."""
        last = self.d.events.filter(kind=kind).order_by("-created_at", "-id").values_list("message", flat=True).first()
        if last != internal_redact(message, cluster=self.d.cluster):  # as event_record stores it
            event_record(kind=kind, deployment=self.d, message=message, duration_ms=duration_ms)


def _backoff(attempt: int, hint: float | None) -> float:
    """Exponential, jittered and bounded; never sooner than the server's Retry-After."""
    base = min(MAX_BACKOFF, 2.0 ** min(attempt, 6))
    return max(hint or 0.0, base * (0.5 + random.random() / 2))


def reconcile_pass(deployment_id: int, *, fence=lambda: None) -> float | None:
    """One pass of the numbered pipeline; returns seconds until the next pass, or None when settled.

    `fence` raises LockLost when the pass has lost its lock; it runs before every step that calls the target."""
    d = Deployment.objects.select_related("team", "cluster").filter(pk=deployment_id).first()
    if d is None or d.status in SETTLED:  # 1 load
        return None
    p = _Pass(d, fence)
    try:
        try:
            return _run(p)
        except TransientError as e:
            # Counted on the row (the event is history): `d` is the row as this pass found it.
            deployment_observe(deployment_id=d.pk, transient_errors=d.transient_errors + 1)
            event_record(kind=EventKind.TRANSIENT_ERROR, deployment=d, message=str(e))
            fail_if_stuck(d.pk, str(e))
            return _backoff(d.transient_errors, e.retry_after)
        except PermanentError as e:
            _move(p, Status.FAILED, str(e))
            return None
    except StatusMoved as e:
        # A user moved it while this pass ran (paused or deleted it): the pass that change enqueued, waiting for
        # this one's lock, acts on the new status and undoes what this one applied meanwhile.
        log.info("reconcile of deployment %s stopped: %s", d.pk, e)
        return None


def _move(p: _Pass, to: str, reason: str) -> Deployment:
    """The pass's own status change, made only from the status the pass is acting on (StatusMoved otherwise):
    a pass that read `provisioning` must not write `running` over a pause that came in meanwhile."""
    p.d = deployment_transition(deployment=p.d, to=to, reason=reason, expected=p.d.status)
    return p.d


def fail_if_stuck(deployment_id: int, last_reason: str) -> bool:
    """Fail a deployment on its way somewhere (PROGRESSING) whose status has not changed for
    TANDEM_STUCK_AFTER_SECONDS, saying what was last seen; True when it did. The one rule for "stuck", used when a
    pass keeps meeting transient errors and when a pass cannot start because another never finishes."""
    d = Deployment.objects.filter(pk=deployment_id, status__in=PROGRESSING).first()
    if d is None:
        return False
    age = (timezone.now() - d.status_changed_at).total_seconds()
    if age <= settings.TANDEM_STUCK_AFTER_SECONDS:
        return False
    try:
        deployment_transition(deployment=d, to=Status.FAILED, expected=d.status,
                              reason=f"Stuck for {int(age)} s while {d.status}; last observed: "
                                     f"{last_reason.rstrip('.')}. Retry it once that is fixed.")
    except StatusMoved:  # it moved on since it was read (a pause, a delete): not stuck
        return False
    return True


def _run(p: _Pass) -> float | None:
    d = p.d
    target = target_for(d.cluster)
    requeue = settings.TANDEM_RECONCILE_REQUEUE_SECONDS

    if d.status == Status.DELETING:  # 2 deletion
        step = p.step(EventKind.TEARDOWN, lambda: target.teardown(d))
        if not step.ready:
            _write(p)
            return requeue
        _write(p, endpoint_url="", applied_hash="", conditions=[])
        _move(p, Status.DELETED, "Everything the deployment created is gone.")
        return None

    if d.status == Status.PAUSING:  # 2b pause: the serving part goes; the deployment, its keys and history stay
        step = p.step(EventKind.PAUSE, lambda: target.pause(d))
        if not step.ready:
            _write(p)
            return requeue
        # No condition of the serving part carries over: a resume is checked again before users get it.
        p.cond("ServeRunning", False, "Paused", step.message)
        _write(p, applied_hash="", conditions=[], ready_estimate_seconds=deployment_ready_estimate(d))
        _move(p, Status.PAUSED, "Paused: nothing of it runs and it holds no quota. Resume it to serve again.")
        return None

    try:  # 3 validate
        spec_check(d.spec_typed, target_kind=d.cluster.kind,
                   source_roots=source_roots_of(cluster=d.cluster, team=d.team))
    except SpecError as e:
        raise PermanentError(f"The spec is no longer valid: {e}") from None
    p.cond("Approved", True, "Approved")
    if d.status == Status.APPROVED:
        d = _move(p, Status.PROVISIONING, "Provisioning started.")

    pools = p.step(EventKind.NODE_POOLS, lambda: target.ensure_node_pools(d))  # 4 node pools
    p.cond("NodePoolsReady", pools.ready, "Ready" if pools.ready else "Waiting", pools.message)
    if not pools.ready:
        _write(p)
        return requeue

    desired, desired_hash = target.desired(d)  # 5 desired
    observed = target.observe(d, desired)  # 6 observe (built once: the pass compares with it twice)
    if not observed.exists or observed.applied_hash != desired_hash:  # 7 apply
        if d.status == Status.RUNNING:
            reason = "The application disappeared from the cluster; re-deploying." if not observed.exists \
                else "The cluster drifted from the spec; re-applying."
            d = _move(p, Status.PROVISIONING, reason)
        target.preflight(d)
        p.step(EventKind.APPLIED, lambda: _apply(target, d, desired))
        deployment_observe(deployment_id=d.pk, applied_hash=desired_hash)
        observed = target.observe(d, desired)
    p.cond("Applied", True, "Applied", f"spec hash {desired_hash[:12]}")

    serve_ok = observed.serve_status == "RUNNING"  # 8 derive
    p.note(EventKind.SERVE_STATUS, f"{observed.serve_status or 'Unknown'}: {observed.message}".rstrip(": "))
    p.cond("ServeRunning", serve_ok, observed.serve_status or "Unknown", observed.message)
    if observed.serve_status == "DEPLOY_FAILED":
        _write(p)
        # Leave nothing half-deployed behind: the reason is kept on the deployment, and retry re-applies.
        p.step(EventKind.TEARDOWN, lambda: target.teardown(d))
        raise PermanentError(f"Ray Serve could not deploy the application: {observed.message} "
                             "The application was removed; fix the spec, then retry.")
    if not serve_ok:
        _write(p, endpoint_url=observed.endpoint_url)
        return requeue
    answers = p.step(EventKind.ENDPOINT, lambda: target.endpoint_answers(d, observed))
    checked = _conformance_checked(p)
    ready = endpoint_ready(checked, generation=d.generation, answers=answers.ready, message=answers.message)
    p.cond("EndpointReady", ready["status"], ready["reason"], ready["message"])
    starts_serving = answers.ready and d.status != Status.RUNNING  # provisioning or updating: serving from now
    # Users wait on the run of a pending endpoint: if its task failed or was lost, run it again, not wait for ever.
    overdue = (answers.ready and not starts_serving and ready["reason"] == "ConformancePending"
               and _conformance_overdue(d))
    requested = {"conformance_requested_at": timezone.now()} if starts_serving or overdue else {}
    # Seen serving by this pass, on the cluster as it is now (not what the row said): `tandem_demo` waits on it. When
    # it starts serving, else at most once a SERVING_SEEN_EVERY: a steady deployment's passes mostly write nothing.
    now = timezone.now()
    stale = d.serving_seen_at is None or now - d.serving_seen_at >= SERVING_SEEN_EVERY
    seen = {"serving_seen_at": now} if answers.ready and (starts_serving or stale) else {}
    _write(p, endpoint_url=observed.endpoint_url, observed_generation=d.generation if answers.ready else d.observed_generation,
           **requested, **seen)
    if not answers.ready:
        return requeue
    if starts_serving:
        _move(p, Status.RUNNING, "Serving.")
        _conformance_enqueue(d.pk)
    elif overdue:
        event_record(kind=EventKind.CONFORMANCE_REQUEUED, deployment=d,
                     message=f"No conformance result {settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS} s after the "
                             "run was started; running the suite again.")
        _conformance_enqueue(d.pk)
    return None


def _conformance_checked(p: _Pass) -> list[dict]:
    """ConformancePassed from the latest run of this generation; the conditions as this pass will write them.

    With no run of this generation yet, the condition stays as it is (an earlier generation's result, or none)."""
    d = p.d
    run = ConformanceRun.objects.filter(deployment=d, generation=d.generation).first()  # newest first
    if run is None:
        return d.conditions
    result = conformance_passed(passed=run.passed, summary=run.summary, pd_health=run.pd_health)
    p.cond("ConformancePassed", result["status"], result["reason"], result["message"])
    return condition_set(d.conditions, type="ConformancePassed", now=timezone.now(), **p.updates["ConformancePassed"])


def _conformance_overdue(d: Deployment) -> bool:
    """The run the endpoint waits for was never requested (a row from before this was kept), or was requested
    (or last re-requested) longer ago than a run can take."""
    requested = d.conformance_requested_at
    limit = settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS
    return requested is None or (timezone.now() - requested).total_seconds() > limit


def _conformance_enqueue(deployment_id: int) -> None:
    """Check the endpoint's OpenAI behaviour through the gateway each time it (re)starts serving."""
    run_conformance.delay(deployment_id)


def _apply(target, d, desired) -> Step:
    step = target.apply(d, desired)
    detail = f": {step.message}" if step.message else ""
    return Step(ready=True, message=f"Applied generation {d.generation}{detail}")


def _write(p: _Pass, **fields) -> None:  # 9 write status if changed
    # Only a pass that raised no transient error gets here (one that does counts it instead): the run ends.
    deployment_observe(deployment_id=p.d.pk, condition_updates=p.updates, transient_errors=0, **fields)
