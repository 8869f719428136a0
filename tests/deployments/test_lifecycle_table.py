"""The state machine, table-driven: every (from, to) pair is either allowed or refused by the writer."""
import itertools

import pytest
from django.utils import timezone

from deployments.errors import Conflict, StatusMoved
from deployments.gateway_channels import ROUTE_EVENTS_CHANNEL, route_event
from deployments.lifecycle import (BILLED, EDITABLE, HOLDS_QUOTA, LIVE, PAUSABLE, RECONCILED, SERVING, SETTLED,
                                   TERMINAL, TRANSITIONS, UNSETTLED, Status)
from deployments.services.actions import deployment_transition
from deployments.services.status import RECONCILE_TASK
from deployments.spec import spec_parse
from tests.factories import DeploymentFactory, spec_input
from tests.support.broker import queued

ALLOWED = {
    ("pending_approval", "approved"), ("pending_approval", "rejected"), ("pending_approval", "withdrawn"),
    ("approved", "provisioning"), ("approved", "failed"), ("approved", "deleting"), ("approved", "pausing"),
    ("provisioning", "running"), ("provisioning", "failed"), ("provisioning", "deleting"), ("provisioning", "pausing"),
    ("running", "updating"), ("running", "provisioning"), ("running", "failed"), ("running", "deleting"),
    ("running", "pausing"),
    ("updating", "running"), ("updating", "failed"), ("updating", "deleting"), ("updating", "pausing"),
    ("failed", "approved"), ("failed", "deleting"), ("failed", "pausing"),
    ("pausing", "paused"), ("pausing", "failed"), ("pausing", "deleting"),
    ("paused", "provisioning"), ("paused", "deleting"),
    ("deleting", "deleted"), ("deleting", "failed"),
}
PAIRS = [(a, b) for a, b in itertools.product(Status.values, Status.values) if a != b]


def test_table_matches_the_documented_lifecycle():
    actual = {(a, b) for a, nxt in TRANSITIONS.items() for b in nxt}
    assert actual == ALLOWED
    assert TERMINAL == {"rejected", "withdrawn", "deleted"}


def test_a_paused_deployment_is_live_but_neither_serving_nor_holding_quota_nor_reconciled():
    """Its name and keys stay (the gateway answers it with a 503); its GPUs go back to the team; beat leaves it
    alone. While it is pausing it still holds its nodes."""
    assert "paused" in LIVE and "paused" not in SERVING and "paused" not in HOLDS_QUOTA
    assert "paused" in SETTLED and "paused" not in RECONCILED and "paused" not in BILLED
    assert "pausing" in UNSETTLED and "pausing" in HOLDS_QUOTA and "pausing" in BILLED and "pausing" not in SERVING
    assert "paused" not in EDITABLE and "pausing" not in EDITABLE


def test_whatever_holds_nodes_or_is_on_its_way_to_them_can_be_paused():
    """Stop paying while it waits for capacity (provisioning) or rolls out (updating), as when it runs."""
    assert PAUSABLE == {"approved", "provisioning", "running", "updating", "failed"}
    assert PAUSABLE == {s for s in HOLDS_QUOTA if "pausing" in TRANSITIONS[s]}


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "new"), PAIRS)
def test_every_transition_is_allowed_or_refused(current, new, django_capture_on_commit_callbacks, redis_client):
    d = DeploymentFactory(status=current)
    if (current, new) in ALLOWED:
        gateways = redis_client.pubsub()
        gateways.subscribe(ROUTE_EVENTS_CHANNEL)
        gateways.get_message(timeout=1)  # the subscription's confirmation
        with django_capture_on_commit_callbacks(execute=True):
            deployment_transition(deployment=d, to=new, reason="table test")
        d.refresh_from_db()
        assert d.status == new
        event = d.events.get()
        assert event.before["status"] == current and event.after["status"] == new
        # Work is enqueued after commit exactly when a reconciler has something to do (a failed deployment's: the
        # release of what it runs on).
        assert queued(redis_client, task=RECONCILE_TASK) == (
            [[d.pk]] if new in {"approved", "provisioning", "updating", "deleting", "pausing", "failed"} else [])
        # Every status change may open or close the endpoint: the gateways are told.
        told = gateways.get_message(timeout=2)
        assert told and told["data"].decode() == route_event(team_id=d.team_id, deployment_id=d.pk)
    else:
        with pytest.raises(Conflict):
            deployment_transition(deployment=d, to=new)
        d.refresh_from_db()
        assert d.status == current
        assert not d.events.exists()


@pytest.mark.django_db
def test_same_status_and_reason_is_a_no_op():
    d = DeploymentFactory(status="running", status_reason="Serving.")
    deployment_transition(deployment=d, to="running", reason="Serving.")
    assert not d.events.exists()


@pytest.mark.django_db
def test_a_change_made_on_a_status_that_moved_since_is_refused_and_writes_nothing():
    """A reconcile pass that read `provisioning` and met Serve's DEPLOY_FAILED may not write `failed` over a pause
    that came in meanwhile, although pausing → failed is allowed (a pause whose teardown fails)."""
    d = DeploymentFactory(status="pausing", status_reason="Pause requested.")
    with pytest.raises(StatusMoved, match="pausing now, not provisioning"):
        deployment_transition(deployment=d, to="failed", reason="DEPLOY_FAILED", expected="provisioning")
    d.refresh_from_db()
    assert (d.status, d.status_reason) == ("pausing", "Pause requested.") and not d.events.exists()
    deployment_transition(deployment=d, to="paused", reason="torn down", expected="pausing")
    d.refresh_from_db()
    assert d.status == "paused"


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "new"), sorted(ALLOWED))
def test_once_its_deletion_was_requested_a_deployment_only_goes_on_out(current, new):
    """Every move the table allows, for a deployment whose deletion was asked for (one that failed while being
    deleted, say): only deleting, deleted and failed are still allowed, so nothing brings it back to running."""
    d = DeploymentFactory(status=current, delete_requested_at=timezone.now())
    if new in {"deleting", "deleted", "failed"}:
        deployment_transition(deployment=d, to=new, reason="table test")
        d.refresh_from_db()
        assert d.status == new
    else:
        with pytest.raises(Conflict, match="its deletion was requested, so it can only be deleted"):
            deployment_transition(deployment=d, to=new, reason="table test")
        d.refresh_from_db()
        assert d.status == current and not d.events.exists()


@pytest.mark.django_db
def test_the_status_writer_records_when_a_deletion_was_first_requested():
    d = DeploymentFactory(status="running")
    assert d.delete_requested_at is None
    deployment_transition(deployment=d, to="deleting")
    d.refresh_from_db()
    first = d.delete_requested_at
    assert first == d.status_changed_at
    deployment_transition(deployment=d, to="failed", reason="teardown failed")
    deployment_transition(deployment=d, to="deleting", reason="retried")
    d.refresh_from_db()
    assert d.delete_requested_at == first


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "new"), sorted((a, b) for a, b in ALLOWED if a in ("running", "failed")))
def test_a_proposed_update_survives_a_move_only_to_where_it_can_still_be_decided(current, new, member):
    """An update is decided while the deployment runs or has failed; any other move drops it with an event that
    keeps it, so the approvals queue never holds what nobody can approve."""
    bigger = spec_input(decode={"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4,
                                "tensor_parallel_size": 4})
    d = DeploymentFactory(status=current, proposed_spec=spec_parse(bigger, target_kind="kubernetes").to_dict(),
                          proposed_by=member)
    assert d.proposal_open
    deployment_transition(deployment=d, to=new, reason="table test")
    d.refresh_from_db()
    if (current, new) == ("running", "failed"):
        assert (d.proposal_open, d.proposed_spec["decode"]["nodes"], d.proposed_by) == (True, 2, member)
        assert not d.events.filter(kind="update_withdrawn").exists()
    else:
        assert (d.proposal_open, d.proposed_spec, d.proposed_by) == (False, None, None)
        assert d.events.get(kind="update_withdrawn").before["proposed_spec"]["decode"]["nodes"] == 2
