"""Rollouts as a user gets one: a running deployment updated through the services (deployments.services.actions),
and moved along its steps through the reconciler's own writer (rollout_record)."""
from deployments.models import Deployment, Rollout
from deployments.services import actions
from deployments.services.rollouts import rollout_active, rollout_record
from tests.factories import DeploymentFactory, UserFactory, spec_input


def rollout_started(*, team, cluster, admin, model_id: str = "llama-3-8b-v2", **spec_over) -> Rollout:
    """A running deployment of `team` whose admin asked for new weights (`model_id`), approved: a side-by-side
    rollout.
    With the weights unchanged and other settings in `spec_over`, an in-place one."""
    d = DeploymentFactory(team=team, cluster=cluster, status="running", generation=1, observed_generation=1)
    new = spec_input(**spec_over)
    new["model"] = {**new["model"], "id": model_id}
    actions.deployment_update(actor=admin, deployment=d, spec=new)
    d.refresh_from_db()
    if d.proposed_spec is not None:  # approved by another admin: nobody approves their own proposal
        approver = UserFactory(is_staff=True, is_superuser=True)
        actions.deployment_approve(actor=approver, deployment=d, generation=d.generation,
                                   proposed_hash=d.proposed_spec_hash)
    return rollout_active(Deployment.objects.get(pk=d.pk))


def rollout_at_step(rollout: Rollout, step: int, weight: int, **fields) -> Rollout:
    """The rollout shifting traffic, on `step` at `weight` percent, as the reconciler writes it."""
    rollout_record(rollout=rollout, state=Rollout.State.SHIFTING, step=step, weight=weight, **fields)
    return rollout
