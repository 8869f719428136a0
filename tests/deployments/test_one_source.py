"""Each rule several processes rely on is defined once: the status sets in `deployments.lifecycle`, the secret
formats in `deployments.credential_format`, the gateways' channels in `deployments.gateway_channels`, the event kinds in `deployments.event_kinds`.
These tests read what the gateway's SQL, the reconciler and the scraper actually select, and scan the code for a
second definition (or, for event kinds, a writer that does not use the declared one)."""
import ast
import re
import asyncio
from pathlib import Path

import pytest
from django.utils import timezone

from deployments import lifecycle
from deployments.event_kinds import EventKind, status_kind
from deployments.lifecycle import LIVE, RECONCILED, SCRAPED, SERVING, SETTLED, Status
from deployments.models import Deployment, Event
from deployments.services.events import event_record
from gateway.config import database_conninfo
from gateway.routing import Route
from gateway.store import Store
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory, spec_restore
from workers.pipeline import reconcile_pass
from workers.resync import resync_slice

ROOT = Path(__file__).resolve().parents[2]
APPS = ("controlplane", "deployments", "workers", "observability", "gateway", "usage", "frontend", "bench", "local")


@pytest.fixture
def one_per_status(transactional_db):
    """A deployment in every status (committed, so the gateway's own connection sees them)."""
    team, cluster = TeamFactory(), ClusterFactory()
    out = {}
    for status in Status:
        d = DeploymentFactory(team=team, cluster=cluster, status=status, endpoint_url="http://127.0.0.1:9/")
        d.spec["model_id"] = f"model-{status}"
        spec_restore(d)
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
    failed = by_status[Status.FAILED]
    resynced = set(resync_slice(budget=len(by_status)))
    # a failed one is work in flight until what it ran on is released
    assert {d.status for d in by_status.values() if d.pk in resynced} == set(RECONCILED) | lifecycle.RELEASES
    Deployment.objects.filter(pk=failed.pk).update(released_at=timezone.now())
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


def test_secret_formats_and_the_gateways_channels_are_declared_once():
    from deployments import credential_format as cf
    from deployments import gateway_channels as gc

    owned = {cf.API_KEY_PREFIX, cf.ACCESS_TOKEN_PREFIX, gc.KEY_EVENTS_CHANNEL, gc.ROUTE_EVENTS_CHANNEL}
    found = []
    for path in _python_files():
        if path in (ROOT / "deployments" / "credential_format.py", ROOT / "deployments" / "gateway_channels.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in owned:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


# --- Event kinds: declared once (deployments.event_kinds), written only as declared members ---

def _takes_a_kind(annotation) -> bool:
    """`EventKind`, `EventKind | None`: a parameter that carries an event kind to the audit trail."""
    return annotation is not None and any(isinstance(n, ast.Name) and n.id == "EventKind" for n in ast.walk(annotation))


def _kind_parameters(trees) -> dict[str, tuple[int | None, str]]:
    """Every function of the apps that takes an event kind (event_record, deployment_transition, the pipeline's
    step and note, pause and resume, ...), found by its annotation: name → (position in a call, keyword)."""
    found = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            positional = node.args.posonlyargs + node.args.args
            skip = 1 if positional and positional[0].arg in ("self", "cls") else 0
            for i, arg in enumerate(positional):
                if _takes_a_kind(arg.annotation):
                    found[node.name] = (i - skip, arg.arg)
            for arg in node.args.kwonlyargs:
                if _takes_a_kind(arg.annotation):
                    found[node.name] = (None, arg.arg)
    return found


def _callee(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _kind_problem(expr, passed_on: set[str]) -> str | None:
    """Why `expr` is not a declared kind: a member of EventKind, status_kind(...), or a kind parameter of the
    function it is in, passed on."""
    if isinstance(expr, ast.IfExp):
        return _kind_problem(expr.body, passed_on) or _kind_problem(expr.orelse, passed_on)
    if isinstance(expr, ast.BoolOp):
        return next(filter(None, (_kind_problem(v, passed_on) for v in expr.values)), None)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "EventKind":
        return None if expr.attr in EventKind.names else f"EventKind.{expr.attr} is not declared"
    if isinstance(expr, ast.Call) and _callee(expr) == "status_kind":
        return None
    if isinstance(expr, ast.Name) and expr.id in passed_on or isinstance(expr, ast.Constant) and expr.value is None:
        return None
    return f"{ast.unparse(expr)} is not an EventKind member"


def _creates_an_event(call: ast.Call) -> bool:
    """Event(...), Event.objects.create/bulk_create/get_or_create(...), x.events.create(...)."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id == "Event"
    if not isinstance(f, ast.Attribute) or f.attr not in ("create", "bulk_create", "get_or_create",
                                                          "update_or_create"):
        return False
    owner = f.value
    return isinstance(owner, ast.Attribute) and (
        owner.attr == "events" or owner.attr == "objects" and isinstance(owner.value, ast.Name)
        and owner.value.id == "Event")


def event_kind_writes(sources: dict[str, str]) -> list[str]:
    """Each place in `sources` ({name: code}) that writes an event kind other than a declared EventKind member,
    or creates an Event other than through event_record."""
    trees = {name: ast.parse(code, name) for name, code in sources.items()}
    takes = _kind_parameters(trees.values())
    found = []

    def visit(node, passed_on: set[str], name: str):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            passed_on = passed_on | {a.arg for a in args if _takes_a_kind(a.annotation)}
        if isinstance(node, ast.Call):
            if _creates_an_event(node) and name != "deployments/services/events.py":
                found.append(f"{name}:{node.lineno} creates an Event; use event_record")
            if (where := takes.get(_callee(node))) is not None:
                position, keyword = where
                given = [k.value for k in node.keywords if k.arg == keyword]
                if not given and position is not None and len(node.args) > position:
                    given = [node.args[position]]
                for expr in given:
                    if problem := _kind_problem(expr, passed_on):
                        found.append(f"{name}:{node.lineno} {problem}")
        for child in ast.iter_child_nodes(node):
            visit(child, passed_on, name)

    for name, tree in trees.items():
        visit(tree, set(), name)
    return found


def test_every_writer_of_the_audit_trail_writes_a_declared_kind():
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in _python_files()}
    assert event_kind_writes(sources) == []


def test_the_scan_finds_a_kind_written_as_a_literal_or_not_declared():
    code = '''
from deployments.event_kinds import EventKind, status_kind

def event_record(*, kind: EventKind, deployment=None): ...

class Pass:
    def step(self, kind: EventKind, fn): event_record(kind=kind)

def transition(*, to, event_kind: EventKind | None = None):
    event_record(kind=event_kind or status_kind(to))

def f(p, d, ok, kind):
    event_record(kind=EventKind.REQUESTED if ok else EventKind.EDITED)
    p.step(EventKind.APPLIED, lambda: None)
    transition(to="running")
    event_record(kind="requested")
    event_record(kind=f"status_{d.status}")
    event_record(kind=EventKind.NO_SUCH_KIND)
    p.step("teardown", lambda: None)
    transition(to="failed", event_kind=kind)
    d.events.create(kind=EventKind.REQUESTED)
'''
    assert [line.split(" ", 1)[0] for line in event_kind_writes({"m.py": code})] == [
        "m.py:16", "m.py:17", "m.py:18", "m.py:19", "m.py:20", "m.py:21"]


def _kind_values(tree) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in EventKind.values]


def test_each_kind_is_declared_once_and_nowhere_else():
    """Within EventKind every value is its own (enum.unique also stops a repeat at import); elsewhere, a dict,
    tuple, list or set of two or more kinds is a second declaration (the portal kept one of labels once)."""
    tree = ast.parse((ROOT / "deployments" / "event_kinds.py").read_text())
    enum = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "EventKind")
    declared = [a.value.elts[0].value for a in enum.body if isinstance(a, ast.Assign)]
    assert len(declared) == len(set(declared)) and set(declared) == set(EventKind.values)
    found = []
    for path in _python_files():
        if path == ROOT / "deployments" / "event_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            keys = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(
                node, (ast.Tuple, ast.List, ast.Set)) else []
            kinds = [k for k in keys if isinstance(k, ast.Constant) and k.value in EventKind.values]
            if len(kinds) >= 2 and len(kinds) == len(keys):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_every_status_change_has_its_kind_with_the_status_words():
    reached = {to for nxt in lifecycle.TRANSITIONS.values() for to in nxt}
    assert {k for k in EventKind.values if k.startswith("status_")} == {f"status_{s}" for s in reached}
    assert all(status_kind(s).label == Status(s).label for s in reached)


def test_the_audit_trail_refuses_a_kind_not_declared(db):
    team = TeamFactory()
    with pytest.raises(ValueError):
        event_record(kind="team_note", team=team)
    assert event_record(kind=EventKind.TEAM_UPDATED, team=team).kind == "team_updated"


# --- The spec's JSON: read only by deployments.spec; everyone else reads the facts stored beside it ---

# An ORM path into the spec's JSON (`spec__model_id`, `deployment__spec__pause__idle_minutes`, "-spec__x" in an
# order_by), and a SQL path into it (`d.spec->>'model_id'`, `spec -> 'engine'`).
ORM_SPEC_PATH = re.compile(r"-?(?:\w+__)?spec__\w+")
SQL_SPEC_PATH = re.compile(r"\bspec\s*->")


def spec_json_reads(sources: dict[str, str]) -> list[str]:
    """Each place in `sources` ({name: text}, Python or a template) that reads the spec's JSON by path: a keyword
    or a string that is an ORM lookup into it, or a SQL JSON path on it."""
    found = []
    for name, text in sources.items():
        if not name.endswith(".py"):
            found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1)
                      if ORM_SPEC_PATH.search(line) or SQL_SPEC_PATH.search(line)]
            continue
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.Call):
                found += [f"{name}:{node.lineno} {k.arg}" for k in node.keywords
                          if k.arg and ORM_SPEC_PATH.fullmatch(k.arg)]
            elif (value := _string_of(node)) is not None and (
                    ORM_SPEC_PATH.fullmatch(value) or SQL_SPEC_PATH.search(value)):
                found.append(f"{name}:{node.lineno} {value.strip()[:40]!r}")
    return found


def _string_of(node) -> str | None:
    """A string constant's text; an f-string's with each placeholder read as `x` (`f"spec__{stage}__nodes"`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    return None


def test_only_the_spec_module_reads_the_spec_json_by_path():
    """The gateway, quota, idle pause, search and the queue read `Deployment`'s stored facts
    (deployments.spec.spec_facts), so a second reading of the JSON cannot drift from the spec's own."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in _python_files()
               if p != ROOT / "deployments" / "spec.py"}
    sources |= {str(p.relative_to(ROOT)): p.read_text() for app in APPS for p in (ROOT / app).rglob("*.html")}
    assert spec_json_reads(sources) == []


def test_the_scan_finds_a_spec_json_path_in_a_lookup_a_string_sql_or_a_template():
    code = '''
from django.db.models import F, Q
from django.db.models.fields.json import KT

Deployment.objects.filter(spec__model_id="m")
Deployment.objects.exclude(Q(spec__pause__idle_minutes__isnull=True))
Event.objects.filter(deployment__spec__model_source="s3://x")
rows = qs.values(prefill=KT("spec__prefill__nodes")).order_by(F("spec__engine__max_model_len"))
POOLS = {stage: KT(f"spec__{stage}__nodes") for stage in STAGES}
SQL = "SELECT d.spec->>'model_id' FROM deployments_deployment d"
qs.filter(proposed_spec__isnull=False, model_id="m").order_by("-created_at")
"spec: the approved spec, and spec_facts its facts"
'''
    template = '{% if d.proposal_open %}<code>{{ d.model_id }}</code>{% endif %}\n{{ d|lookup:"spec__model_id" }}\n'
    assert sorted(line.split(" ", 1)[0] for line in spec_json_reads({"m.py": code, "t.html": template})) == [
        "m.py:10", "m.py:5", "m.py:6", "m.py:7", "m.py:8", "m.py:8", "m.py:9", "t.html:2"]
