"""The state machine, table-driven: every (from, to) pair is either allowed or refused by the writer."""
import itertools

import pytest

from deployments.errors import Conflict
from deployments.lifecycle import TERMINAL, TRANSITIONS, Status
from deployments.services.actions import deployment_transition
from tests.factories import DeploymentFactory

ALLOWED = {
    ("pending_approval", "approved"), ("pending_approval", "rejected"), ("pending_approval", "withdrawn"),
    ("approved", "provisioning"), ("approved", "failed"), ("approved", "deleting"),
    ("provisioning", "running"), ("provisioning", "failed"), ("provisioning", "deleting"),
    ("running", "updating"), ("running", "provisioning"), ("running", "failed"), ("running", "deleting"),
    ("updating", "running"), ("updating", "failed"), ("updating", "deleting"),
    ("failed", "approved"), ("failed", "deleting"),
    ("deleting", "deleted"), ("deleting", "failed"),
}
PAIRS = [(a, b) for a, b in itertools.product(Status.values, Status.values) if a != b]


def test_table_matches_the_documented_lifecycle():
    actual = {(a, b) for a, nxt in TRANSITIONS.items() for b in nxt}
    assert actual == ALLOWED
    assert TERMINAL == {"rejected", "withdrawn", "deleted"}


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "new"), PAIRS)
def test_every_transition_is_allowed_or_refused(current, new, django_capture_on_commit_callbacks):
    d = DeploymentFactory(status=current)
    if (current, new) in ALLOWED:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            deployment_transition(deployment=d, to=new, reason="table test")
        d.refresh_from_db()
        assert d.status == new
        event = d.events.get()
        assert event.before["status"] == current and event.after["status"] == new
        # Work is enqueued after commit exactly when a reconciler has something to do.
        assert len(callbacks) == (1 if new in {"approved", "provisioning", "updating", "deleting"} else 0)
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
