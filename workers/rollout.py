"""A side-by-side rollout, one reconcile pass at a time (workers.pipeline calls `rollout_pass` while a deployment
is `updating` with such a rollout: deployments.models.Rollout).

The new generation comes up beside the old with the surge's replicas, is conformance-checked through the gateway
(Tandem's service key reaches the newest generation), then takes the spec's steps of traffic while the old one
gives back replicas (workers.rollout_plan). Each step is watched for `step_seconds` and judged against the old
generation over the same window (workers.rollout_judge); a regression, a failed check or an admin's abort sends
every request back to the old generation and removes the new one. Done means every request goes to the new
generation and the old application is gone.
"""
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from deployments.event_kinds import EventKind
from deployments.models import Deployment, Rollout
from deployments.services.events import event_record
from deployments.conditions import condition_get
from deployments.services.rollouts import rollout_record, rollout_spec_restore
from deployments.spec import STAGES, spec_load
from observability.models import ConformanceRun
from observability.tasks import run_conformance
from usage.selectors import generation_stats
from workers.rollout_judge import judge
from workers.rollout_plan import Sizes, effective_weight, next_sizes, surge_of, wanted_replicas
from workers.targets.base import AppUnit

State = Rollout.State


@dataclass
class Outcome:
    """What the pass writes on the deployment, the status it moves to and when the next pass runs."""

    fields: dict = field(default_factory=dict)
    move: tuple[str, str] | None = None
    wait: float | None = None
    then: object = None  # a callable run after the write (a conformance run to start)


def _requeue() -> float:
    return settings.TANDEM_RECONCILE_REQUEUE_SECONDS


class _Rollout:
    """One pass over one rollout: the two generations' specs and units, and what the pass writes."""

    def __init__(self, p, target, r: Rollout):
        self.p, self.target, self.r, self.d = p, target, r, p.d
        self.old_spec, self.new_spec = spec_load(r.from_spec), self.d.spec_typed
        self.sizes = Sizes(old=dict(r.replicas["old"]), new=dict(r.replicas["new"]))
        self.now = timezone.now()

    # --- the two applications -------------------------------------------------------------------------------
    def old_unit(self, sizes: Sizes) -> AppUnit:
        # Untouched (its spec's own bounds, as it was applied) until it gives a replica back.
        full = sizes.old == wanted_replicas(self.old_spec)
        return AppUnit(self.r.from_app, self.old_spec, replicas=None if full else dict(sizes.old),
                       port_half=self.d.app_port_half)

    @property
    def new_port_half(self) -> int:
        # The other half of the NIXL ports: the two generations' engines may share a node (the local target).
        return 1 - self.d.app_port_half

    def new_unit(self, sizes: Sizes | None = None) -> AppUnit:
        """The new generation's application: at `sizes`, or its spec's own bounds (as outside a rollout)."""
        return AppUnit(self.r.to_app, self.new_spec, replicas=dict(sizes.new) if sizes else None,
                       port_half=self.new_port_half)

    def ensure(self, unit: AppUnit):
        """Apply a unit when the cluster lacks it or holds another config; what the cluster has now."""
        desired, want = self.target.desired(self.d, unit)
        observed = self.target.observe(self.d, desired, unit)
        if not observed.exists or observed.applied_hash != want:
            self.target.preflight(self.d)
            step = self.target.apply(self.d, desired)
            self.p.note(EventKind.APPLIED, f"Generation {self._gen(unit)}: {step.message}")
            observed = self.target.observe(self.d, desired, unit)
        return observed

    def _gen(self, unit: AppUnit) -> int:
        return self.r.to_generation if unit.app_generation == self.r.to_app else self.r.from_generation

    def gone(self, unit: AppUnit) -> bool:
        return self.p.step(EventKind.TEARDOWN, lambda: self.target.teardown(self.d, unit)).ready

    # --- writes ---------------------------------------------------------------------------------------------
    def record(self, **fields) -> None:
        if "replicas" in fields:
            surge = surge_of(Sizes(**fields["replicas"]), old=self.old_spec, new=self.new_spec)
            peak = {s: max(self.r.peak_surge.get(s, 0), surge[s]) for s in STAGES}
            fields["peak_surge"] = peak
        rollout_record(rollout=self.r, **fields)

    def record_event(self, kind: EventKind, message: str, **after) -> None:
        event_record(kind=kind, deployment=self.d, message=message, after={"rollout": self.r.pk, **after})

    def routing(self, weight: int, url: str) -> dict:
        """The deployment's fields the gateway splits traffic by."""
        return {"next_endpoint_url": url, "next_generation": self.r.to_generation, "next_weight": weight}

    # --- the states -----------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        r = self.r
        if r.state == State.ROLLING_BACK:
            return self.roll_back()
        # The pools hold the whole surge until the rollout ends. Sized to each pass's plan, they would shrink as
        # the old generation is about to give a replica back, before it has (on eks the node group, not Tandem,
        # picks the node that goes), and grow again a pass later for a GPU node that takes minutes to join.
        # Quota and cost count the same surge for as long (deployments.surge).
        pools = self.p.step(EventKind.NODE_POOLS, lambda: self.target.ensure_node_pools(
            self.d, extra=dict.fromkeys(STAGES, self.new_spec.rollout.max_surge)))
        if not pools.ready:
            return Outcome(wait=_requeue())
        if r.paused:
            return Outcome(wait=_requeue())
        return {State.STARTING: self.starting, State.CHECKING: self.checking, State.SHIFTING: self.shifting}[r.state]()

    def planned(self) -> Sizes:
        """The sizes this pass moves to (the node pools are grown for them first)."""
        r = self.r
        if r.state == State.STARTING:
            return next_sizes(self.sizes, weight=0, old=self.old_spec, new=self.new_spec, moved=True)
        if r.state == State.SHIFTING and r.step < len(self.new_spec.rollout.steps):
            step_weight = self.new_spec.rollout.steps[r.step]
            return next_sizes(self.sizes, weight=step_weight, old=self.old_spec, new=self.new_spec,
                              moved=r.weight == step_weight)
        return self.sizes

    def starting(self) -> Outcome:
        sizes = self.planned()
        self.record(replicas=sizes.as_dict())
        self.ensure(self.old_unit(sizes))
        observed = self.ensure(self.new_unit(sizes))
        if observed.serve_status == "DEPLOY_FAILED":
            return self.start_rollback(f"Ray Serve could not deploy generation {self.r.to_generation}: "
                                       f"{observed.message}")
        if observed.serve_status != "RUNNING" or sizes != self.sizes:
            return Outcome(wait=_requeue())
        answers = self.target.endpoint_answers(self.d, observed)
        if not answers.ready:
            return Outcome(wait=_requeue())
        self.record(state=State.CHECKING, step_started_at=self.now)
        self.record_event(EventKind.ROLLOUT_STEP, f"Generation {self.r.to_generation} serves beside generation "
                                           f"{self.r.from_generation} with {self._sizes_text(sizes)}; checking it "
                                           "before it takes traffic.", weight=0)
        return Outcome(fields=self.routing(0, observed.endpoint_url) | {"conformance_requested_at": self.now},
                       wait=_requeue(), then=lambda: run_conformance.delay(self.d.pk))

    def checking(self) -> Outcome:
        run = ConformanceRun.objects.filter(deployment=self.d, generation=self.r.to_generation).first()
        if run is None:
            waited = (self.now - (self.r.step_started_at or self.now)).total_seconds()
            if waited > settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS:
                return self.start_rollback(f"No conformance result for generation {self.r.to_generation} after "
                                           f"{int(waited)} s.")
            return Outcome(wait=_requeue())
        health = run.pd_health or {}
        if not run.passed or health.get("ok") is False:
            return self.start_rollback(f"Generation {self.r.to_generation} failed its conformance run: "
                                       f"{run.summary}", evidence={"conformance_run": run.pk, "summary": run.summary})
        self.record(state=State.SHIFTING, step=0, step_started_at=None)
        return Outcome(wait=0.0)

    def shifting(self) -> Outcome:
        r, rollout = self.r, self.new_spec.rollout
        if r.step >= len(rollout.steps):  # every step judged: the old application goes
            return self.finish()
        step_weight = rollout.steps[r.step]
        sizes = self.planned()
        if sizes != self.sizes:
            self.record(replicas=sizes.as_dict())
        old = self.ensure(self.old_unit(sizes))
        new = self.ensure(self.new_unit(sizes))
        if new.serve_status == "DEPLOY_FAILED":
            return self.start_rollback(f"Ray Serve could not scale generation {r.to_generation}: {new.message}")
        settled = new.serve_status == "RUNNING" and old.serve_status == "RUNNING" and sizes == self.sizes
        weight = effective_weight(step_weight, sizes, new=self.new_spec) if settled else r.weight
        fields = self.routing(weight, new.endpoint_url)
        if weight != r.weight:
            reached = weight == step_weight
            self.record(weight=weight, step_started_at=self.now if reached else None)
            if reached:
                self.record_event(EventKind.ROLLOUT_STEP, f"Step {r.step + 1} of {len(rollout.steps)}: {weight}% of "
                                                   f"requests go to generation {r.to_generation} "
                                                   f"({self._sizes_text(sizes)}).", weight=weight, step=r.step)
            return Outcome(fields=fields, wait=_requeue())
        if weight != step_weight or not settled or r.step_started_at is None:
            return Outcome(fields=fields, wait=_requeue())
        watched = (self.now - r.step_started_at).total_seconds()
        if watched < rollout.step_seconds:
            return Outcome(fields=fields, wait=min(_requeue(), rollout.step_seconds - watched))
        verdict = self.judged(step_weight)
        if not verdict.ok:
            return self.start_rollback("Generation {} regressed at {}%: {}".format(
                r.to_generation, step_weight, "; ".join(verdict.reasons)), evidence=verdict.evidence)
        self.record(step=r.step + 1, step_started_at=None)
        return Outcome(fields=fields, wait=0.0)

    def judged(self, step_weight: int):
        """This step's window judged, and logged with its evidence."""
        r, since = self.r, self.r.step_started_at
        targets = self.new_spec.targets
        old = generation_stats(deployment_id=self.d.pk, generation=r.from_generation, since=since, targets=targets)
        new = generation_stats(deployment_id=self.d.pk, generation=r.to_generation, since=since, targets=targets)
        baseline = _last_logged_old(r.steps_log) if old.requests == 0 else None
        verdict = judge(old=old, new=new, rollout=self.new_spec.rollout, baseline=baseline)
        entry = {"step": r.step, "weight": step_weight, "since": since.isoformat(), "until": self.now.isoformat(),
                 "ok": verdict.ok, "reasons": list(verdict.reasons), **verdict.evidence}
        self.record(steps_log=[*r.steps_log, entry])
        return verdict

    def finish(self) -> Outcome:
        """Every request goes to the new generation and its step was judged: the old application goes, and
        the new one is the deployment's."""
        r = self.r
        if not self.gone(self.old_unit(self.sizes)):
            return Outcome(wait=_requeue())
        observed = self.ensure(self.new_unit())
        sizes = Sizes(old={s: 0 for s in STAGES}, new=dict(self.sizes.new))
        self.record(state=State.DONE, replicas=sizes.as_dict(), finished_at=self.now,
                    reason=f"Every request goes to generation {r.to_generation}; generation {r.from_generation} "
                           "is gone.")
        self.record_event(EventKind.ROLLOUT_DONE, self.r.reason, peak_surge=self.r.peak_surge,
                   seconds=int((self.now - r.created_at).total_seconds()))
        return Outcome(fields={"endpoint_url": observed.endpoint_url,
                               "endpoint_generation": r.to_generation, "app_generation": r.to_app,
                               "app_port_half": self.new_port_half,
                               "observed_generation": r.to_generation, "next_endpoint_url": "",
                               "next_generation": None, "next_weight": 0, "serving_seen_at": self.now},
                       move=("running", f"Generation {r.to_generation} serves every request."))

    # --- rolling back ---------------------------------------------------------------------------------------
    def start_rollback(self, reason: str, evidence: dict | None = None) -> Outcome:
        """Every request back to the old generation at once; the new one goes on the next passes."""
        self.record(state=State.ROLLING_BACK, reason=reason, step_started_at=self.now)
        self.record_event(EventKind.ROLLOUT_ROLLED_BACK,
                          f"Rolling back to generation {self.r.from_generation}: {reason}", evidence=evidence or {})
        return Outcome(fields={"next_weight": 0}, wait=_requeue())

    def roll_back(self) -> Outcome:
        r = self.r
        drained = (self.now - (r.step_started_at or self.now)).total_seconds() >= settings.TANDEM_ROLLOUT_DRAIN_SECONDS
        if not drained:
            return Outcome(fields={"next_weight": 0}, wait=_requeue())
        if not self.gone(self.new_unit(self.sizes)):
            return Outcome(fields={"next_weight": 0}, wait=_requeue())
        full = Sizes(old=wanted_replicas(self.old_spec), new={s: 0 for s in STAGES})
        self.record(replicas=full.as_dict())
        old = self.ensure(self.old_unit(full))
        if old.serve_status != "RUNNING":
            return Outcome(fields={"next_endpoint_url": "", "next_generation": None, "next_weight": 0},
                           wait=_requeue())
        self.record(state=State.ROLLED_BACK, finished_at=self.now)
        return self.restore()

    def restore(self) -> Outcome:
        """The deployment's spec is the old generation's again, at a generation of its own (generations only
        count up): what serves is what the spec says, and a new update starts from it. The application did not
        change, so its conformance result carries over."""
        self.p.d = rollout_spec_restore(rollout=self.r, old_spec=self.old_spec)
        checked = condition_get(self.d.conditions, "ConformancePassed")
        if checked is not None:
            self.p.cond("ConformancePassed", checked["status"] == "True", checked["reason"], checked["message"])
        return Outcome(fields={"next_endpoint_url": "", "next_generation": None, "next_weight": 0,
                               "endpoint_generation": self.r.from_generation,
                               "observed_generation": self.p.d.generation},
                       move=("running", f"Rolled back: generation {self.r.from_generation} serves every request. "
                                        f"{self.r.reason}"))

    def _sizes_text(self, sizes: Sizes) -> str:
        return ", ".join(f"{s} {sizes.old[s]} old + {sizes.new[s]} new" for s in STAGES)


def _last_logged_old(log: list[dict]) -> dict | None:
    """The old generation's figures of the last step that had any: the baseline once it serves nothing."""
    for entry in reversed(log):
        if (entry.get("old") or {}).get("requests"):
            return entry["old"]
    return None


def rollout_pass(p, target, r: Rollout) -> Outcome:
    """One pass over a side-by-side rollout (see the module's docstring)."""
    return _Rollout(p, target, r).run()


def rollout_in_place_done(d: Deployment) -> None:
    """An update that rolled in place serves: its rollout is done."""
    r = d.rollouts.filter(state__in=Rollout.ACTIVE, mode=Rollout.Mode.IN_PLACE).first()
    if r is None:
        return
    now = timezone.now()
    rollout_record(rollout=r, state=State.DONE, weight=100, finished_at=now,
                   reason=f"Generation {r.to_generation} rolled in place and serves.")
    event_record(kind=EventKind.ROLLOUT_DONE, deployment=d, message=r.reason,
                 after={"rollout": r.pk, "seconds": int((now - r.created_at).total_seconds())})

