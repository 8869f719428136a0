"""Two tenants on one Tandem, attacked on every route: an outsider who is admin of another team gets 0 reads and 0
writes of the victim team's objects.

The routes are not a hand list. REST operations come from drf-spectacular's schema generator (every path and
method it documents), portal and Django admin URLs from the URL conf (`get_resolver`), and a check ties the two
together: every REST route in the URL conf is reached by some documented operation. A route added tomorrow is
attacked tomorrow; a route whose parameter this file cannot fill with a victim's object fails until it can.

Each request is made twice, once naming the victim's objects and once naming objects that do not exist: the two
answers must be the same (a guessed id answers as a missing one), detail and action URLs must answer 403 or 404
(the admin site: its login page), list URLs must show none of the victim's objects, and the victim's rows (and
the broker's queue) must be exactly as they were.
"""
import base64
import json
import re

from urllib.parse import urlencode

import pytest
from celery import current_app
from django.contrib.auth import get_user_model
from django.forms.models import model_to_dict
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from deployments.hashing import content_hash
from deployments.models import (AccessToken, ApiKey, Cluster, Deployment, Event, ExternalIdentity, Membership,
                                Rollout, ScimGroup, Team)
from deployments.services import actions
from deployments.services.api_keys import api_key_create
from deployments.services.credentials import credential_mint
from deployments.services.rollouts import rollout_begin
from deployments.spec import spec_parse
from tests.factories import (MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, MembershipFactory,
                             TeamFactory, spec_input)

# In every name the victim team owns: a response that contains it read the victim's data. Long enough that no
# random text on a page (a 64-character CSRF token, a CSP nonce) holds it by chance: "q7z" did, about once in
# 3,000 pages, and failed CI on /team/cost/.
MARK = "q7zleak9"
MISSING_ID = 987654321
HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def _victim_world():
    """The victim team (admin bob, member carol: a pending request, a running deployment with a proposed update,
    a key, tokens) and the outsider alice, admin of her own team with a deployment, a key and a token."""
    cluster = ClusterFactory(name="shared-k8s", kind=Cluster.Kind.KUBERNETES,
                             config={"namespace_prefix": "tandem-", "metrics_url": "http://10.0.0.9:8080/metrics",
                                     "runtime_images": RUNTIME_IMAGES,
                                     "model_sources": {**MODEL_SOURCES,
                                                       "s3": [*MODEL_SOURCES["s3"], f"s3://victim-weights-{MARK}"]}})
    victim = TeamFactory(slug=f"victim-team-{MARK}", name=f"Victim {MARK}", gpu_quota=64)
    bob = MembershipFactory(team=victim, role=Membership.Role.ADMIN, user__username=f"victim-bob-{MARK}").user
    carol_m = MembershipFactory(team=victim, role=Membership.Role.MEMBER, user__username=f"victim-carol-{MARK}")
    carol = carol_m.user
    model = {"id": f"victim-model-{MARK}", "source": f"s3://victim-weights-{MARK}/llama"}
    pending = actions.deployment_request(actor=carol, team=victim, cluster=cluster, name=f"victim-pending-{MARK}",
                                         spec=spec_input(model=model), purpose=f"secret plans {MARK}")
    running = DeploymentFactory(team=victim, cluster=cluster, requested_by=carol, name=f"victim-running-{MARK}",
                                status="running", spec=pending.spec)
    pool = {"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 4}
    actions.deployment_update(actor=carol, deployment=running, spec=spec_input(model=model, prefill=pool))
    # An earlier update of it, rolling out: as the services record one (deployments.services.rollouts).
    rollout = rollout_begin(deployment=running, old_spec=spec_parse(spec_input()), new_spec=running.spec_typed)
    key, _ = api_key_create(actor=bob, team=victim, name=f"victim-key-{MARK}", all_deployments=False,
                            deployments=[running])
    token, _ = credential_mint(model=AccessToken, user=bob, name=f"victim-token-{MARK}")
    identity = ExternalIdentity.objects.create(user=bob, issuer="https://idp.example", subject=f"victim-sub-{MARK}")
    group = ScimGroup.objects.create(display_name=f"victim-group-{MARK}")
    group.members.add(bob)

    outsiders = TeamFactory(slug="outsider-team", gpu_quota=64)
    alice = MembershipFactory(team=outsiders, role=Membership.Role.ADMIN, user__username="alice").user
    mine = actions.deployment_request(actor=alice, team=outsiders, cluster=cluster, name="alices", spec=spec_input())
    api_key_create(actor=alice, team=outsiders, name="alices-key")
    return {"cluster": cluster, "victim": victim, "bob": bob, "carol": carol, "carol_m": carol_m,
            "pending": pending, "running": Deployment.objects.get(pk=running.pk), "key": key, "token": token,
            "event": Event.objects.filter(team=victim).first(), "alice": alice, "outsiders": outsiders,
            "mine": mine, "identity": identity, "group": group, "rollout": rollout,
            "markers": [MARK, key.key_id, token.key_id]}


def _victim_state(w) -> dict:
    """Every row of the victim's, as values: a write of any kind changes this."""
    victim = w["victim"]
    users = [w["bob"].pk, w["carol"].pk]

    def rows(qs):
        return [model_to_dict(o) | {"_ts": str(getattr(o, "updated_at", ""))} for o in qs.order_by("pk")]

    return {
        "team": rows(Team.objects.filter(pk=victim.pk)),
        "memberships": rows(Membership.objects.filter(team=victim)),
        "deployments": rows(Deployment.objects.filter(team=victim)),
        "keys": rows(ApiKey.objects.filter(team=victim)),
        "tokens": rows(AccessToken.objects.filter(user__in=users)),
        "users": list(get_user_model().objects.filter(pk__in=users).values("username", "is_staff", "is_active",
                                                                            "password").order_by("pk")),
        "events": Event.objects.filter(team=victim).count(),
        "identities": rows(ExternalIdentity.objects.filter(user__in=users)),
        "scim_groups": sorted(ScimGroup.objects.filter(members__in=users).values_list("display_name", "members")),
        "clusters": rows(Cluster.objects.all()),
        "rollouts": rows(Rollout.objects.filter(deployment__team=victim)),
    }


def _broker_mentions(redis_client, ids) -> list:
    """Messages on the broker whose arguments name one of the victim's deployments."""
    found = []
    for raw in redis_client.lrange(current_app.conf.task_default_queue, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        if any(a in ids for a in args):
            found.append((message["headers"]["task"], args))
    return found


# --- the attacker's requests ---------------------------------------------------------------------------------
def _refs(w, *, missing: bool) -> dict:
    """Values that name the victim's objects, or objects that do not exist, by what a field or parameter calls
    them. One place: a new kind of parameter needs a line here (the tests below say which)."""
    if missing:
        return {"deployment": MISSING_ID, "team": "no-such-team-zz", "user": "no-such-user-zz", "key": MISSING_ID,
                "token": MISSING_ID, "member": MISSING_ID, "event": MISSING_ID, "name": "pwned-m",
                "recommendation": "0000deadbeef", "cluster_name": "no-such-cluster-zz", "user_id": MISSING_ID,
                "identity": MISSING_ID, "group": "00000000-0000-4000-8000-00000000dead",
                "rollout": MISSING_ID}
    return {"deployment": w["running"].pk, "team": w["victim"].slug, "user": w["bob"].username,
            "key": w["key"].pk, "token": w["token"].pk, "member": w["carol_m"].pk, "event": w["event"].pk,
            "name": "pwned-v", "recommendation": "a1b2c3d4e5f6", "cluster_name": w["cluster"].name,
            "user_id": w["bob"].pk, "identity": w["identity"].pk, "group": str(w["group"].pk),
            "rollout": w["rollout"].pk}


def _body(w, refs: dict, *, own_team: bool) -> dict:
    """One body that every write could take: each field names a victim's object (or the attacker's own team, with
    the victim's objects inside it)."""
    running = w["running"]
    return {
        "team": w["outsiders"].slug if own_team else refs["team"], "user": refs["user"],
        "deployments": [refs["deployment"]], "deployment": refs["deployment"], "all_deployments": False,
        "cluster": w["cluster"].name, "name": refs["name"], "slug": refs["name"], "purpose": "pwned",
        "comment": "pwned",
        "role": "admin", "gpu_quota": 9999, "allow_self_approval": True, "credential_max_days": 3650,
        "generation": running.generation, "proposed_spec_hash": content_hash(running.proposed_spec),
        "spec": spec_input(prefill={"instance_type": "p5.48xlarge"}),
        "editing_id": refs["deployment"], "confirm_name": running.name, "next": "/deployments/",
    }


def _swap(text: str, refs: dict) -> str:
    """The answer with the names it was asked about replaced by placeholders, so two answers compare."""
    for name, value in sorted(refs.items(), key=lambda kv: -len(str(kv[1]))):
        text = re.sub(rf"(?<![\w-]){re.escape(str(value))}(?![\w-])", f"<{name}>", text)
    return text


def _leaks(w, text: str, sent: dict) -> list[str]:
    """Victim markers in an answer, except the names the attacker sent (an error may quote them back)."""
    for value in sent.values():
        text = text.replace(str(value), "")
    return [m for m in w["markers"] if m in text]


# --- REST: every operation drf-spectacular documents ---------------------------------------------------------
def _schema_operations() -> list[tuple[str, str]]:
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [(path, method) for path, item in paths.items() for method in item if method in HTTP_METHODS]


REST_OPERATIONS = _schema_operations()
# Path parameters of the schema, by resource (the path's segment before it) → which victim object fills them.
REST_PARAMS = {"deployments": "deployment", "teams": "team", "members": "member", "api-keys": "key",
               "tokens": "token", "users": "user", "events": "event", "clusters": None,
               "recommendations": "recommendation", "rollouts": "rollout"}


def _rest_path(path: str, refs: dict, cluster: str) -> tuple[str, bool]:
    """The path with its parameters filled; True when it names a victim's object."""
    def fill(m: re.Match) -> str:
        resource = path[: m.start()].rstrip("/").rsplit("/", 1)[-1]
        assert resource in REST_PARAMS, f"{path}: no victim object for {{{m[1]}}} of {resource!r}; add one"
        kind = REST_PARAMS[resource]
        return cluster if kind is None else str(refs[kind])

    filled = re.sub(r"\{(\w+)\}", fill, path)
    return filled, filled != path and REST_PARAMS.get(path.split("/")[3]) is not None


def _rest_call(client, method: str, url: str, body: dict, query: dict):
    url = f"{url}?{urlencode(query)}"
    if method in ("post", "put", "patch"):
        return getattr(client, method)(url, body, format="json")
    return getattr(client, method)(url)


def _rest_attempts():
    """Each documented operation; one that takes a body twice: naming the victim's team, and naming the
    attacker's own team with the victim's objects inside it."""
    for path, method in REST_OPERATIONS:
        for own_team in ((False, True) if method in ("post", "put", "patch") else (False,)):
            yield pytest.param(path, method, own_team,
                               id=f"{method.upper()} {path}" + (" (own team)" if own_team else ""))


@pytest.fixture
def world(db, redis_client):
    return _victim_world()


def _rest_client(user) -> APIClient:
    client = APIClient()
    _, raw = credential_mint(model=AccessToken, user=user, name="attacker")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.parametrize("path,method,own_team", list(_rest_attempts()))
def test_rest(world, redis_client, path, method, own_team):
    w = world
    client = _rest_client(w["alice"])
    before, ids = _victim_state(w), [w["running"].pk, w["pending"].pk]
    answers = []
    for missing in (False, True):
        refs = _refs(w, missing=missing)
        url, names_victim = _rest_path(path, refs, w["cluster"].name)
        query = {"team": refs["team"], "deployment": refs["deployment"]}
        r = _rest_call(client, method, url, _body(w, refs, own_team=own_team), query)
        answers.append((r.status_code, _swap(r.content.decode(), refs)))
        assert r.status_code < 500, r.content
        if not missing:
            assert not _leaks(w, r.content.decode(), refs | {"cluster": w["cluster"].name}), r.content
            if names_victim:
                assert r.status_code in (403, 404), (url, r.status_code, r.content)
            if path.startswith("/api/v1/clusters/") and method == "get":
                assert "config" not in r.content.decode(), "a member reads a cluster's config"
    (status_a, text_a), (status_b, text_b) = answers
    assert status_a == status_b, f"a guessed id answers {status_a}, a missing one {status_b}"
    if not 200 <= status_a < 300:  # successful answers carry fresh ids and secrets: compared by status only
        assert text_a == text_b
    assert _victim_state(w) == before
    assert _broker_mentions(redis_client, ids) == []


def test_every_rest_route_in_the_url_conf_is_documented_and_attacked(world):
    """The schema drives the REST attacks: no route of the URL conf may be missing from it."""
    refs = _refs(world, missing=False)
    attacked = {resolve(_rest_path(p, refs, "shared-k8s")[0]).url_name for p, _ in REST_OPERATIONS}
    routes = {name for route, name, _ in _url_patterns()
              if route.startswith("api/v1/") and name and "format" not in route and name != "api-root"}
    assert routes - attacked == set()


# --- the portal, Django admin and every other page: every URL pattern --------------------------------------
def _url_patterns(resolver=None, prefix="", namespace=""):
    """(route, namespaced name, pattern) for every URL pattern, walking included URL confs."""
    for p in (resolver or get_resolver()).url_patterns:
        if isinstance(p, URLResolver):
            ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
            yield from _url_patterns(p, prefix + str(p.pattern), ns)
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), f"{namespace}{p.name}" if p.name else None, p


PAGES = [(route, name) for route, name, _ in _url_patterns() if not route.startswith("api/")]
# What an object parameter of a page means, by the route's first segment (admin: by its URL name).
PAGE_OBJECTS = {"deployments": "deployment", "keys": "key", "tokens": "token", "clusters": "cluster_name"}
PAGE_PARAMS = {"rollout_id": "rollout"}  # a second object in a page's URL, by its parameter's name
PAGE_OBJECTS_ADMIN = {"team": "team", "deployment": "deployment", "membership": "member", "apikey": "key",
                      "accesstoken": "token", "event": "event", "user": "user", "externalidentity": "identity",
                      "rollout": "rollout"}
# SCIM (the directory's bearer token, never a session): the victim's user and group by their SCIM ids.
SCIM_OBJECTS = {"Users": "user_id", "Groups": "group"}


def _page_url(route: str, w, refs: dict) -> tuple[str, bool]:
    """The page's URL with its parameters filled by the victim's objects (or missing ones); True when one is an
    object of the victim's."""
    names_object = False

    def fill(m: re.Match) -> str:
        nonlocal names_object
        param = m[1]
        if route.startswith("admin/"):  # admin/<app>/<model>/<object_id>/..., and the admin's catch-all
            parts = route.split("/")
            victim = refs.get(PAGE_OBJECTS_ADMIN.get(parts[2] if len(parts) > 3 else "", ""), MISSING_ID)
            value = {"object_id": victim, "id": victim, "app_label": "deployments", "content_type_id": 1,
                     "url": f"deployments/deployment/{refs['deployment']}/change/"}.get(param)
            names_object = names_object or param in ("object_id", "id", "url")
        elif route.startswith("scim/"):  # scim/v2/<Resource>/<pk>, and SCIM's catch-all
            value = refs.get(SCIM_OBJECTS.get(route.split("/")[2], ""), "victim") if param == "pk" else "Users"
            names_object = True
        elif param in ("uidb64", "token"):  # the password reset link: the victim's uid, a guessed token
            uid = w["bob"].pk if refs["user"] == w["bob"].username else MISSING_ID
            value = urlsafe_base64_encode(force_bytes(uid)) if param == "uidb64" else "guessed-token"
        else:
            value = refs.get(PAGE_PARAMS.get(param) or PAGE_OBJECTS.get(route.split("/")[0], ""))
            names_object = True
        assert value is not None, f"{route}: no victim object for <{param}>; add one"
        return str(value)

    # path() converters (<int:pk>) and re_path() groups ((?P<app_label>...)), then the regex anchors.
    url = re.sub(r"<(?:\w+:)?(\w+)>", fill, route)
    url = re.sub(r"\(\?P<(\w+)>[^)]*\)", fill, url)
    return "/" + re.sub(r"[\^$]", "", url), names_object


def _page_attempts():
    for route, name in PAGES:
        for method in ("get", "post"):
            yield pytest.param(route, name, method, id=f"{method.upper()} /{route or ''}")


@pytest.mark.parametrize("route,name,method", list(_page_attempts()))
def test_page(world, redis_client, route, name, method):
    w = world
    client = Client()
    client.force_login(w["alice"])
    before, ids = _victim_state(w), [w["running"].pk, w["pending"].pk]
    answers = []
    for missing in (False, True):
        refs = _refs(w, missing=missing)
        url, names_victim = _page_url(route, w, refs)
        query = {"team": refs["team"], "q": refs["team"], "cluster": w["cluster"].name}
        body = {k: v for k, v in _body(w, refs, own_team=False).items() if not isinstance(v, dict)}
        body["deployments"] = [refs["deployment"]]
        r = client.get(url, query) if method == "get" else client.post(url, body)
        text = r.content.decode(errors="replace")
        assert r.status_code < 500, text[:2000]
        answers.append((r.status_code, r.get("Location", "")))
        if not missing:
            assert not _leaks(w, text, refs | query), (url, _leaks(w, text, refs | query))
            if names_victim:
                refused = r.status_code in (401, 403, 404, 405) or (
                    r.status_code == 302 and "login" in r["Location"] and route.startswith(("admin/", "accounts/")))
                assert refused, (url, r.status_code, r.get("Location"))
    assert answers[0][0] == answers[1][0], f"a guessed id answers {answers[0][0]}, a missing one {answers[1][0]}"
    assert _victim_state(w) == before
    assert _broker_mentions(redis_client, ids) == []


def test_the_admin_site_is_attacked_with_the_victims_objects_too():
    """Every model the admin registers has a victim object to name (else its pages would be attacked with a
    missing id only), but for shared or Tandem-internal ones with nothing of a team's in them."""
    admin_models = {m[1] for r, _ in PAGES if (m := re.match(r"admin/\w+/(\w+)/<path:object_id>/", r))}
    # django-axes' sign-in records hold usernames and addresses, nothing of a team's.
    # SCIM tokens are the directory's, platform-wide.
    shared = {"group", "cluster", "conformancerun", "accessattempt", "accesslog", "accessfailurelog", "scimtoken"}
    assert admin_models - set(PAGE_OBJECTS_ADMIN) <= shared, admin_models
