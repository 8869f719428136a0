"""The one writer of a deployment's spec and proposal together with the facts stored beside them.

Callers (the spec writers in deployments.services.actions, the status writer) set them through these in their own
transaction and save the fields returned, so a fact can never disagree with the spec it was derived from.
"""
from deployments.cost import cluster_prices, spec_hourly_usd
from deployments.lifecycle import LIVE, proposal_waits
from deployments.models import Deployment
from deployments.spec import DeploymentSpec, spec_facts


def deployment_spec_set(*, deployment: Deployment, spec: DeploymentSpec) -> list[str]:
    """Set the approved spec and its facts (deployments.spec.spec_facts, and its price per hour at the cluster's
    own prices); returns the fields to save."""
    stored = spec.to_dict()
    facts = spec_facts(spec) | {"hourly_usd": spec_hourly_usd(spec, prices=cluster_prices(deployment.cluster))}
    deployment.spec = stored
    for name, value in facts.items():
        setattr(deployment, name, value)
    return ["spec", *facts]


def cluster_deployments_reprice(*, cluster) -> None:
    """Store again the price per hour of the cluster's live deployments after its own prices changed (in the
    cluster edit's transaction)."""
    for d in Deployment.objects.filter(cluster=cluster, status__in=LIVE).select_for_update(of=("self",)):
        d.cluster = cluster  # the edited row, not the one stored before the edit
        d.save(update_fields=deployment_spec_set(deployment=d, spec=d.spec_typed))


def deployment_proposal_set(*, deployment: Deployment, spec: dict | None, by) -> list[str]:
    """Set the proposed update and its author (None, None: nothing waits any more), and whether it waits for an
    approver in the deployment's status (deployments.lifecycle.proposal_waits); returns the fields to save."""
    deployment.proposed_spec, deployment.proposed_by = spec, by
    deployment.proposal_open = proposal_waits(status=deployment.status, proposed=spec is not None)
    return ["proposed_spec", "proposed_by", "proposal_open"]
