"""Each rule several processes rely on is defined once: the status sets in `deployments.lifecycle`, the secret
formats and the revocation channel in `deployments.credential_format`. These tests read what the gateway's SQL,
the reconciler and the scraper actually select, and scan the code for a second definition."""
import ast
import asyncio
from pathlib import Path

import pytest

from deployments import lifecycle
from deployments.lifecycle import LIVE, RECONCILED, SCRAPED, SERVING, SETTLED, Status
from deployments.models import Event
from gateway.config import database_conninfo
from gateway.routing import Route
from gateway.store import Store
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory
from workers.pipeline import reconcile_pass
from workers.resync import resync_slice

ROOT = Path(__file__).resolve().parents[2]
APPS = ("controlplane", "deployments", "workers", "observability", "gateway", "frontend", "bench", "local")


@pytest.fixture
def one_per_status(transactional_db):
    """A deployment in every status (committed, so the gateway's own connection sees them)."""
    team, cluster = TeamFactory(), ClusterFactory()
    out = {}
    for status in Status:
        d = DeploymentFactory(team=team, cluster=cluster, status=status, endpoint_url="http://127.0.0.1:9/")
        d.spec["model_id"] = f"model-{status}"
        d.save()
        out[status] = d
    return team, out


def _gateway_rows(team_id: int) -> list[dict]:
    async def fetch():
        store = Store(database_conninfo())
        await store.open()
        try:
            return await store.team_deployments(team_id)
        finally:
            await store.close()

    return asyncio.run(fetch())


def test_the_gateway_routes_exactly_the_live_set_and_serves_exactly_the_serving_set(one_per_status):
    team, by_status = one_per_status
    rows = _gateway_rows(team.pk)
    assert {r["status"] for r in rows} == set(LIVE)
    serving = {r["status"] for r in rows if Route.from_row(r).serving}
    assert serving == set(SERVING)


def test_the_reconciler_resyncs_the_reconciled_set_and_stops_at_once_for_settled_ones(one_per_status, redis_client):
    _, by_status = one_per_status
    resynced = set(resync_slice(budget=len(by_status)))
    assert {d.status for d in by_status.values() if d.pk in resynced} == set(RECONCILED)
    for status in SETTLED:
        d = by_status[status]
        before = Event.objects.filter(deployment=d).count()
        assert reconcile_pass(d.pk) is None
        assert Event.objects.filter(deployment=d).count() == before  # it did nothing, not even a note


def test_the_sets_are_what_the_state_machine_says():
    assert lifecycle.TERMINAL == {s for s, nxt in lifecycle.TRANSITIONS.items() if not nxt}
    assert LIVE | lifecycle.TERMINAL == set(Status) and not LIVE & lifecycle.TERMINAL
    assert SETTLED | RECONCILED == set(Status) and not SETTLED & RECONCILED
    assert SERVING <= LIVE and SCRAPED == SERVING
    assert lifecycle.UNSETTLED < RECONCILED
    assert lifecycle.HOLDS_QUOTA <= LIVE


def _python_files():
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" not in path.parts:
                yield path


def _status_of(node) -> str | None:
    if isinstance(node, ast.Constant) and node.value in Status.values:
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("Status", "S") \
            and node.attr in Status.names:
        return Status[node.attr].value
    return None


def test_no_module_but_lifecycle_declares_a_set_of_statuses():
    """A tuple, list or set of two or more statuses, or a status quoted inside SQL, anywhere else is a second
    definition that will drift from the state machine."""
    found = []
    sql_quoted = [f"'{s}'" for s in Status.values]
    for path in _python_files():
        if path == ROOT / "deployments" / "lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 \
                    and all(_status_of(e) for e in node.elts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and any(q in node.value for q in sql_quoted):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} (SQL literal)")
    assert found == []


def test_secret_formats_and_the_revocation_channel_are_declared_once():
    from deployments import credential_format as cf

    owned = {cf.API_KEY_PREFIX, cf.ACCESS_TOKEN_PREFIX, cf.KEY_EVENTS_CHANNEL}
    found = []
    for path in _python_files():
        if path == ROOT / "deployments" / "credential_format.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in owned:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []
