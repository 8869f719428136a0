"""One reconcile pass, step by step. See workers.reconcile for the contract."""
import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from deployments.conditions import (
    condition_get, condition_set, conformance_passed, endpoint_ready, seconds_since_transition,
)
from deployments.errors import StatusMoved
from deployments.event_kinds import EventKind
from deployments.lifecycle import PROGRESSING, RELEASES, SETTLED, Status
from deployments.model_sources import source_roots_of
from deployments.models import Deployment
from deployments.redaction import internal_redact
from deployments.runtime_images import runtime_image_errors
from deployments.services.events import event_record
from deployments.services.actions import deployment_transition
from deployments.services.status import deployment_observe
from deployments.serving_deadline import serving_deadline
from deployments.spend import deployment_billed_stretch, deployment_ready_estimate
from deployments.spec import SpecError, spec_check
from observability.models import ConformanceRun, ScrapeState
from observability.tasks import run_conformance
from deployments.services.rollouts import rollout_active
from workers.diagnosis import findings_text
from workers.rollout import rollout_in_place_done, rollout_pass
from workers.targets import target_for
from workers.targets.base import Observed, PermanentError, Step, TransientError

log = logging.getLogger(__name__)
MAX_BACKOFF = 60.0
# How fresh `serving_seen_at` is kept while a deployment serves (`./tandem up` waits for a reading after its start).
SERVING_SEEN_EVERY = dt.timedelta(seconds=30)
# How often a failed deployment whose release the target refuses (a permission, a node group someone else owns) is
# tried again: the refusal is recorded once, and nothing changes until someone fixes it.
RELEASE_REFUSED_RETRY_SECONDS = 300.0


class LockLost(Exception):
    """The pass no longer holds the deployment's reconcile lock (workers.reconcile): it must not touch the target."""


@dataclass
class _End:
    """How a pass ends: the observed fields it writes with the conditions it set, the status it then moves to,
    what follows once it has (a conformance run) and the seconds until the next pass (None: settled)."""

    fields: dict = field(default_factory=dict)
    move: tuple[str, str] | None = None
    then: Callable[[], None] | None = None
    wait: float | None = None


class _Pass:
    """State for one pass: the deployment and what the pass writes once, at its end: the conditions it set, the
    hash it applied and what each step last said."""

    def __init__(self, d: Deployment, fence):
        self.d = d
        self.fence = fence  # raises LockLost; run before each step, since steps call the target
        self.updates: dict[str, dict] = {}  # the conditions this pass set, merged into the row when written
        self.applied: dict = {}  # {"applied_hash": ...} once this pass applied: written however the pass ends
        self.said = dict(d.step_messages)  # {event kind: message}, as event_record stored it

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
        """Record an event unless this step said the same last time (passes repeat; events do not). What it said
        is kept on the row, not read back from the event log, which is history and may be pruned."""
        stored = internal_redact(message, cluster=self.d.cluster)  # as event_record stores it
        if self.said.get(kind.value) != stored:
            event_record(kind=kind, deployment=self.d, message=message, duration_ms=duration_ms)
            self.said[kind.value] = stored


def _backoff(attempt: int, hint: float | None) -> float:
    """Exponential, jittered and bounded; never sooner than the server's Retry-After."""
    base = min(MAX_BACKOFF, 2.0 ** min(attempt, 6))
    return max(hint or 0.0, base * (0.5 + random.random() / 2))


def reconcile_pass(deployment_id: int, *, fence=lambda: None) -> float | None:
    """One pass of the numbered pipeline; returns seconds until the next pass, or None when settled.

    `fence` raises LockLost when the pass has lost its lock; it runs before every step that calls the target."""
    d = Deployment.objects.select_related("team", "cluster").filter(pk=deployment_id).first()
    if d is None or (d.status in SETTLED and not _releasing(d)):  # 1 load
        return None
    p = _Pass(d, fence)
    try:
        try:
            end = _run(p)
        except TransientError as e:
            # Counted on the row (the event is history): `d` is the row as this pass found it. The pass did not
            # finish looking, so it writes no condition.
            if _releasing(d):  # tried until it goes through, however long the cluster is away: said once
                p.note(EventKind.TRANSIENT_ERROR, f"Releasing what the failed deployment runs on: {e}")
            else:
                event_record(kind=EventKind.TRANSIENT_ERROR, deployment=d, message=str(e))
            _write(p, transient_errors=d.transient_errors + 1)
            fail_if_stuck(d.pk, str(e))
            return _backoff(d.transient_errors, e.retry_after)
        except PermanentError as e:
            _write(p)  # what it applied and said; the conditions stay as the last finished pass wrote them
            _move(p, Status.FAILED, str(e))
            return None
        # 9 write, then move: a pass that raised no transient error ends their run.
        _write(p, condition_updates=p.updates, transient_errors=0, **end.fields)
        if end.move:
            _move(p, *end.move)
        if end.then:
            end.then()
        return end.wait
    except StatusMoved as e:
        # A user moved it while this pass ran (paused or deleted it): the pass that change enqueued, waiting for
        # this one's lock, acts on the new status and undoes what this one applied meanwhile.
        _write(p)  # what it applied and said, so that pass neither forgets the hash nor repeats the events
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


def _releasing(d: Deployment) -> bool:
    """A failed deployment whose nodes may still run: the pass releases them (deployments.lifecycle.RELEASES)."""
    return d.status in RELEASES and d.released_at is None


def _run(p: _Pass) -> _End:
    """Steps 2 to 8 of the pass, each a function; the caller makes the one write (9)."""
    target = target_for(p.d.cluster)
    if _releasing(p.d):
        return _release(p, target)
    if p.d.status == Status.DELETING:
        return _delete(p, target)
    if p.d.status == Status.PAUSING:
        return _pause(p, target)
    _validate(p)
    rollout = rollout_active(p.d) if p.d.status == Status.UPDATING else None
    if rollout is not None and rollout.mode == rollout.Mode.SIDE_BY_SIDE:
        out = rollout_pass(p, target, rollout)
        return _End(fields=out.fields, move=out.move, wait=out.wait, then=out.then)
    if not _node_pools(p, target):
        return _End(wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)
    observed = _apply_if_changed(p, target)
    return _serve_status(p, target, observed) or _endpoint(p, target, observed)


def _delete(p: _Pass, target) -> _End:
    """2 deletion: everything the deployment created goes."""
    if not p.step(EventKind.TEARDOWN, lambda: target.teardown(p.d)).ready:
        return _End(wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)
    return _End(fields={"endpoint_url": "", "applied_hash": "", "conditions": []},
                move=(Status.DELETED, "Everything the deployment created is gone."))


def _pause(p: _Pass, target) -> _End:
    """2b pause: the serving part goes; the deployment, its keys and history stay."""
    d = p.d
    step = p.step(EventKind.PAUSE, lambda: target.pause(d))
    if not step.ready:
        return _End(wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)
    # No condition of the serving part carries over: a resume is checked again before users get it.
    p.cond("ServeRunning", False, "Paused", step.message)
    return _End(fields={"applied_hash": "", "conditions": [], "ready_estimate_seconds": deployment_ready_estimate(d)},
                move=(Status.PAUSED, "Paused: nothing of it runs and it holds no quota. Resume it to serve again."))


def _release(p: _Pass, target) -> _End:
    """2c a failed deployment: whatever failed it, what it runs on goes, as in a pause (node groups to zero nodes and
    kept for a retry, the RayService or Ray application removed), and the release says how long its nodes were
    billed and what that cost. A release the target refuses is said once and tried again later, never failed
    again (that would only write the same failure)."""
    d = p.d
    try:
        step = p.step(EventKind.TEARDOWN, lambda: target.pause(d))
    except PermanentError as e:
        p.note(EventKind.RELEASED, f"Tandem could not release what the failed deployment runs on, which may still "
                                   f"be billed: {e}")
        return _End(wait=RELEASE_REFUSED_RETRY_SECONDS)
    if not step.ready:
        return _End(wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)
    now = timezone.now()
    stretch = deployment_billed_stretch(deployment=d, now=now)
    ran = "" if stretch is None else (
        f" Its nodes were billed for {stretch.hours:.2f} h (since {stretch.since:%Y-%m-%d %H:%M} UTC): "
        f"${stretch.usd:,.2f} at the cluster's prices.")
    event_record(kind=EventKind.RELEASED, deployment=d, after={"released": True},
                 message=f"Released what the failed deployment ran on: {step.message}{ran} Retry it to run it again.")
    return _End(fields={"released_at": now, "applied_hash": ""})


def _validate(p: _Pass) -> None:
    """3 validate: a spec the cluster can no longer run fails the deployment; an approved one starts provisioning."""
    d = p.d
    try:
        spec_check(d.spec_typed, target_kind=d.cluster.kind,
                   source_roots=source_roots_of(cluster=d.cluster, team=d.team))
    except SpecError as e:
        raise PermanentError(f"The spec is no longer valid: {e}") from None
    if problems := runtime_image_errors(cluster=d.cluster, spec=d.spec_typed):  # before any node is bought
        raise PermanentError(" ".join(problems))
    p.cond("Approved", True, "Approved")
    if d.status == Status.APPROVED:
        _move(p, Status.PROVISIONING, "Provisioning started.")


def _node_pools(p: _Pass, target) -> bool:
    """4 build what the application runs on: True once the node pools are ready."""
    pools = p.step(EventKind.NODE_POOLS, lambda: target.ensure_node_pools(p.d))
    p.cond("NodePoolsReady", pools.ready, "Ready" if pools.ready else "Waiting", pools.message)
    return pools.ready


def _apply_if_changed(p: _Pass, target) -> Observed:
    """5 build the desired application, 6 observe it (once: compared twice), 7 apply only when the cluster lacks
    it or holds another spec hash; returns what the cluster has now."""
    d = p.d
    desired, desired_hash = target.desired(d)
    observed = target.observe(d, desired)
    if not observed.exists or observed.applied_hash != desired_hash:
        if d.status == Status.RUNNING:
            reason = "The application disappeared from the cluster; re-deploying." if not observed.exists \
                else "The cluster drifted from the spec; re-applying."
            d = _move(p, Status.PROVISIONING, reason)
        target.preflight(d)
        p.step(EventKind.APPLIED, lambda: _apply(target, d, desired))
        p.applied = {"applied_hash": desired_hash}
        observed = target.observe(d, desired)
    p.cond("Applied", True, "Applied", f"spec hash {desired_hash[:12]}")
    return observed


def _serve_status(p: _Pass, target, observed: Observed) -> _End | None:
    """8 derive, from Serve and from what the cluster reports: how the pass ends while the application does not run;
    None once it does.

    While it does not run, every pass reads what is wrong (workers.diagnosis) into ServeRunning and, when it
    changes, a `not_serving` event. On its way to serving (provisioning: nothing of it serves yet), a cause that
    cannot heal fails the deployment at once; otherwise the serving deadline does, counted from the first pass that
    found its nodes ready and its application applied. Either way the next pass releases what it runs on
    (`_release`). A deployment that serves (or whose update rolls while its old replicas serve) is only told:
    Serve replaces a replica that dies."""
    d = p.d
    p.note(EventKind.SERVE_STATUS, f"{observed.serve_status or 'Unknown'}: {observed.message}".rstrip(": "))
    running = observed.serve_status == "RUNNING"
    was = condition_get(d.conditions, "ServeRunning")
    if running and d.status == Status.RUNNING and was is not None and was["status"] == "False":
        # A replica died (or Serve replaced one) under a deployment that serves, and Serve has it back.
        seconds = seconds_since_transition(was, now=timezone.now())
        p.note(EventKind.SERVE_RECOVERED, f"Serve runs every replica again, {seconds:.0f} s after it reported "
                                          f"{was.get('reason') or 'a fault'}.", duration_ms=int(seconds * 1000))
    if running:
        p.cond("ServeRunning", True, "RUNNING", observed.message)
        return None
    findings = target.diagnose(d, observed)
    found = findings_text(findings)
    reason = next((f.reason for f in sorted(findings, key=lambda f: not f.fatal)), observed.serve_status or "Unknown")
    p.cond("ServeRunning", False, reason, found or observed.message)
    if found:
        p.note(EventKind.NOT_SERVING, found)
    fatal = [f for f in findings if f.fatal] if d.status == Status.PROVISIONING else []
    if observed.serve_status == "DEPLOY_FAILED":
        return _End(move=(Status.FAILED, f"Ray Serve could not deploy the application: {observed.message} Tandem "
                                         "removes it and releases its nodes (kept for a retry); fix the spec, then "
                                         "retry."))
    if fatal:
        causes = "; ".join(f"{f.stage}: {f.reason}: {f.message}" for f in fatal)
        return _End(move=(Status.FAILED, f"It cannot serve, and waiting will not change that: {causes} Tandem "
                                         "releases its nodes (kept for a retry); fix the cause, then retry."))
    fields = {"endpoint_url": observed.endpoint_url}
    if d.status == Status.PROVISIONING:  # nothing of it serves: a deadline; an update's old replicas still serve
        deadline = serving_deadline(d.spec_typed, config=d.cluster.config_typed, target_kind=d.cluster.kind)
        now = timezone.now()
        due = d.serve_deadline_at or now + dt.timedelta(seconds=deadline.seconds)
        if now > due:
            last = found.replace("\n", "; ") or f"Serve says {observed.serve_status or 'nothing'}: {observed.message}"
            return _End(move=(Status.FAILED, f"Not serving {deadline.seconds / 60:.0f} min after its nodes were "
                                             f"ready, the deadline from {deadline.why}. Last seen: {last} Tandem "
                                             "releases its nodes (kept for a retry); fix the cause, then retry."))
        fields["serve_deadline_at"] = due
    return _End(fields=fields, wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)


def _endpoint(p: _Pass, target, observed: Observed) -> _End:
    """8 derive, from the endpoint and its conformance run: whether users get it, and whether it starts serving."""
    d = p.d
    answers = p.step(EventKind.ENDPOINT, lambda: target.endpoint_answers(d, observed))
    checked = _conformance_checked(p)
    ready = endpoint_ready(checked, generation=d.generation, answers=answers.ready, message=answers.message)
    p.cond("EndpointReady", ready["status"], ready["reason"], ready["message"])
    fields = {"endpoint_url": observed.endpoint_url,
              "observed_generation": d.generation if answers.ready else d.observed_generation,
              "endpoint_generation": d.generation if answers.ready else d.endpoint_generation}
    if not answers.ready:
        return _End(fields=fields, wait=settings.TANDEM_RECONCILE_REQUEUE_SECONDS)
    now = timezone.now()
    # Seen serving by this pass, on the cluster as it is now (not what the row said): `tandem_demo` waits on it. When
    # it starts serving, else at most once a SERVING_SEEN_EVERY: a steady deployment's passes mostly write nothing.
    if d.status != Status.RUNNING or d.serving_seen_at is None or now - d.serving_seen_at >= SERVING_SEEN_EVERY:
        fields["serving_seen_at"] = now
    if d.status != Status.RUNNING:  # provisioning or updating: serving from now
        def then():
            rollout_in_place_done(d)
            _conformance_enqueue(d.pk)
        return _End(fields=fields | {"conformance_requested_at": now}, move=(Status.RUNNING, "Serving."), then=then)
    _kv_transfer(p, target, now=now)
    # Users wait on the run of a pending endpoint: if its task failed or was lost, run it again, not wait for ever.
    if ready["reason"] == "ConformancePending" and _conformance_overdue(d):
        return _End(fields=fields | {"conformance_requested_at": now}, then=lambda: _conformance_requeue(d))
    return _End(fields=fields)


def _kv_transfer(p: _Pass, target, *, now) -> None:
    """8 derive, for a deployment that serves: KvTransfer from the decode's KV reads as the scrapes saw them
    (observability.scraper). A decode whose reads from prefill all fail while Serve runs both (as when it keeps a
    restarted prefill's NIXL peer) is restarted, once per failing spell; when reads succeed again the condition and
    an event say how long it took."""
    d = p.d
    state = ScrapeState.objects.filter(deployment=d).first()
    failing_since = state.kv_failing_since if state else None
    current = condition_get(d.conditions, "KvTransfer")
    if failing_since is None:
        if current is not None and current["status"] == "False":
            seconds = seconds_since_transition(current, now=now)
            message = f"KV moves from prefill to decode again, {seconds:.0f} s after its reads were seen failing."
            p.note(EventKind.KV_RECOVERED, message, duration_ms=int(seconds * 1000))
            p.cond("KvTransfer", True, "Recovered", message)
        elif current is None:
            p.cond("KvTransfer", True, "NoFailedReads", "No KV read from prefill has failed on the decode.")
        return
    if current is not None and current["status"] == "False":
        return  # restarted once in this spell: a fresh decode that still fails has another cause
    failed = (state.kv_reads or {}).get("failed", 0)
    seen = (f"Every KV read of the decode from prefill has failed since {failing_since:%H:%M:%S} UTC ({failed:g} "
            "in the scrape that saw it).")
    restart = p.step(EventKind.DECODE_RESTARTED, lambda: _restart_decode(target, d, seen))
    p.cond("KvTransfer", False, "DecodeRestarted" if restart.ready else "ReadsFailing", restart.message)


def _restart_decode(target, d: Deployment, seen: str) -> Step:
    step = target.restart_stage(d, "decode")
    return Step(ready=step.ready, message=f"{seen} {step.message}")


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


def _conformance_requeue(d: Deployment) -> None:
    """Run the suite again for an endpoint whose run never reported, saying so in the deployment's history."""
    event_record(kind=EventKind.CONFORMANCE_REQUEUED, deployment=d,
                 message=f"No conformance result {settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS} s after the "
                         "run was started; running the suite again.")
    _conformance_enqueue(d.pk)


def _conformance_enqueue(deployment_id: int) -> None:
    """Check the endpoint's OpenAI behaviour through the gateway each time it (re)starts serving."""
    run_conformance.delay(deployment_id)


def _apply(target, d, desired) -> Step:
    step = target.apply(d, desired)
    detail = f": {step.message}" if step.message else ""
    return Step(ready=True, message=f"Applied generation {d.generation}{detail}")


def _write(p: _Pass, **fields) -> None:
    """9 the pass's one write of what it observed (deployments.services.status writes only what changed)."""
    deployment_observe(deployment_id=p.d.pk, step_messages=p.said, **(p.applied | fields))
