"""Whether users' keys reach a deployment is stored with the conditions it follows from, by their one writer, and
migrated for rows written before: the gateway reads the column, never the conditions' JSON."""
import importlib

import pytest
from django.apps import apps
from django.utils import timezone

from deployments.conditions import condition_set, conformance_passed, endpoint_ready
from deployments.models import Deployment
from deployments.services.status import deployment_observe
from gateway.store import TEAM_DEPLOYMENTS_SQL
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db
migration = importlib.import_module("deployments.migrations.0019_endpoint_access")


def _pending(d) -> list[dict]:
    return condition_set([], type="EndpointReady", status=False, reason="ConformancePending",
                         generation=d.generation, now=timezone.now())


def _checked(d, conditions, *, fabric_ok: bool) -> list[dict]:
    fabric = {"ok": fabric_ok, "messages": [] if fabric_ok else ["KV moves over TCP. Fix: an image with libfabric."]}
    checked = conformance_passed(passed=True, summary="12/12 checks passed.", pd_health={"ok": True, "fabric": fabric})
    conditions = condition_set(conditions, type="ConformancePassed", generation=d.generation, now=timezone.now(),
                               **checked)
    return condition_set(conditions, type="EndpointReady", generation=d.generation, now=timezone.now(),
                         **endpoint_ready(conditions, generation=d.generation, answers=True))


def _access(d) -> tuple[str, str]:
    return tuple(Deployment.objects.values_list("endpoint_access", "endpoint_access_message").get(pk=d.pk))


def test_the_conditions_writer_stores_whether_users_get_in_checking_closed_then_open():
    d = DeploymentFactory(status="running")
    deployment_observe(deployment_id=d.pk, conditions=_pending(d))
    assert _access(d) == ("checking", "")
    deployment_observe(deployment_id=d.pk, conditions=_checked(d, _pending(d), fabric_ok=False))
    access, message = _access(d)
    assert access == "closed" and "KV moves over TCP" in message
    deployment_observe(deployment_id=d.pk, conditions=_checked(d, _pending(d), fabric_ok=True))
    assert _access(d) == ("open", "")
    # A later generation's re-check keeps the endpoint its users already had.
    d.refresh_from_db()
    deployment_observe(deployment_id=d.pk, condition_updates={"EndpointReady": {
        "status": False, "reason": "ConformancePending", "generation": d.generation + 1}})
    assert _access(d) == ("open", "")


def test_rows_written_before_get_their_access_from_their_conditions():
    checking, closed, fresh = (DeploymentFactory(status="running") for _ in range(3))
    Deployment.objects.filter(pk=checking.pk).update(conditions=_pending(checking))
    Deployment.objects.filter(pk=closed.pk).update(conditions=_checked(closed, _pending(closed), fabric_ok=False))
    migration.endpoint_access_backfill(apps, None)
    assert _access(checking) == ("checking", "") and _access(closed)[0] == "closed" and _access(fresh) == ("open", "")


def test_the_gateway_reads_the_stored_access_not_the_conditions():
    assert "d.endpoint_access" in TEAM_DEPLOYMENTS_SQL and "conditions" not in TEAM_DEPLOYMENTS_SQL
