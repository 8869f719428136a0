"""Routing by `model` within the key's team: a per-team table of deployments, cached briefly."""
import logging
import random
import time
from dataclasses import dataclass

from yarl import URL

from deployments.conditions import CHECKING, CLOSED
from deployments.lifecycle import SERVING, STARTING, Status
from deployments.secret_refs import SecretRefError, secret_resolve
from gateway.cache import MISSING, AsyncCache
from gateway.errors import deployment_over_budget, deployment_paused, forbidden, model_not_found, unavailable
from gateway.wake import ready_in

log = logging.getLogger(__name__)

ENDPOINTS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions",
             "embeddings": "/v1/embeddings"}


def upstream_headers(cluster_row: dict) -> list[tuple[str, str]]:
    """Headers the gateway adds for this deployment's cluster.

    A `ray` cluster with a secret reference gets its token as a bearer token (Ray 2.60 token auth). The
    client's own Authorization (a Tandem key) is never passed on.
    """
    if cluster_row.get("cluster_kind") == "ray" and cluster_row.get("cluster_secret_ref"):
        return [("Authorization", f"Bearer {secret_resolve(cluster_row['cluster_secret_ref'])}")]
    return []


GENERATION_HEADER = b"x-tandem-generation"


def endpoint_urls(base: str) -> dict:
    """Each OpenAI endpoint's URL under a deployment's base URL (none without one)."""
    base = (base or "").rstrip("/")
    return {name: URL(base + path, encoded=True) for name, path in ENDPOINTS.items()} if base else {}


@dataclass(frozen=True, slots=True)
class Upstream:
    """One generation of a deployment: its URLs and the response header that names it, built once per route."""

    generation: int
    urls: dict  # endpoint name -> yarl.URL (parsing a URL per request costs)
    header: tuple[bytes, bytes]

    @classmethod
    def of(cls, generation: int, base: str) -> "Upstream":
        return cls(generation, endpoint_urls(base), (GENERATION_HEADER, str(generation).encode()))


@dataclass(frozen=True, slots=True)
class Route:
    """One deployment as the gateway sees it: where to send traffic and what to check first."""

    deployment_id: int
    name: str
    model_id: str
    status: str
    max_model_len: int | None
    current: Upstream  # the generation at endpoint_url
    headers: tuple
    created: int = 0
    problem: str = ""  # set when the deployment cannot take traffic for a reason other than its status
    checking: bool = False  # serving, but its first conformance run has not finished: users wait for it
    closed: str = ""  # serving, but closed to users until fixed (KV not on the EFA asked for): why, and the fix
    wake_on_request: bool = False  # paused, and a request may wake it
    ready_estimate: int | None = None  # seconds a resume is expected to take (its own history)
    status_changed_at: float = 0.0  # epoch seconds: for a deployment on its way to serving, when it set off
    # During a side-by-side rollout: the next generation, and the share of requests (0-1) it gets.
    next: Upstream | None = None
    next_share: float = 0.0

    @property
    def serving(self) -> bool:
        return self.status in SERVING and bool(self.current.urls) and not self.problem

    def upstream(self, *, service: bool = False, draw=random.random) -> Upstream:
        """The generation that serves one request: the next one with probability `next_share` (a uniform draw in
        [0, 1) below it), else the current one. The whole request goes to the one chosen. Tandem's own service
        keys always reach the next generation while there is one: its conformance run checks it before any user's
        request does (workers.rollout)."""
        if self.next is None or (not service and draw() >= self.next_share):
            return self.current
        return self.next

    @classmethod
    def from_row(cls, row: dict) -> "Route":
        problem, headers = "", ()
        try:
            headers = tuple(upstream_headers(row))
        except SecretRefError as e:
            # Key holders read `problem`: it names the cluster; where its secret lives is for the operator's log.
            problem = (f"The credential of cluster {row.get('cluster_name') or 'of this deployment'} is not "
                       "available; a platform admin has to fix it.")
            log.warning("deployment %s: %s (%s)", row["id"], problem, e)
        weight = row.get("next_weight") or 0
        following = (Upstream.of(row["next_generation"] or 0, row["next_endpoint_url"])
                     if row.get("next_endpoint_url") else None)
        return cls(deployment_id=row["id"], name=row["name"], model_id=row["model_id"], status=row["status"],
                   max_model_len=row["max_model_len"],
                   current=Upstream.of(row.get("endpoint_generation") or 0, row["endpoint_url"]), headers=headers,
                   created=int(row["updated_at"].timestamp()) if row.get("updated_at") else 0, problem=problem,
                   checking=row.get("endpoint_access") == CHECKING,
                   closed=row.get("endpoint_access_message", "") if row.get("endpoint_access") == CLOSED else "",
                   wake_on_request=bool(row.get("wake_on_request")),
                   ready_estimate=row.get("ready_estimate_seconds"),
                   status_changed_at=float(row.get("status_changed_at") or 0),
                   next=following, next_share=min(weight, 100) / 100 if following else 0.0)

    def open_to(self, key) -> bool:
        """Serving, and checked and not closed; Tandem's own service keys (conformance runs) reach it regardless."""
        return self.serving and ((not self.checking and not self.closed) or key.service)


class TeamRoutes:
    """A team's live deployments by model id; a serving deployment wins over one that is not."""

    __slots__ = ("by_model",)

    def __init__(self, routes: list[Route]):
        self.by_model: dict[str, Route] = {}
        for route in routes:  # newest first
            current = self.by_model.get(route.model_id)
            if current is None or (route.serving and not current.serving):
                self.by_model[route.model_id] = route


class Router:
    """Routes by team, refreshed every `ttl` and refused (503) past `max_stale` without PostgreSQL's word."""

    def __init__(self, store, *, ttl: float, max_stale: float, max_entries: int, waker=None):
        self._store = store
        self.waker = waker  # gateway.wake.Waker, set at startup (needs Redis); None: paused deployments stay asleep
        self.cache = AsyncCache(self._load, ttl=ttl, max_stale=max_stale, negative_ttl=ttl, max_entries=max_entries)

    async def _load(self, team_id: int) -> TeamRoutes:
        return TeamRoutes([Route.from_row(r) for r in await self._store.team_deployments(team_id)])

    async def resolve(self, key, model: str) -> Route:
        """The route for this key and model, or the OpenAI-shaped 404 / 403 / 503."""
        routes = self.cache.peek(key.team_id)
        if routes is MISSING:
            routes = await self.cache.get(key.team_id)
        route = routes.by_model.get(model)
        if route is None:
            raise model_not_found(model)
        if not key.allows(route.deployment_id):
            raise forbidden(model)
        if route.status == Status.PAUSED:
            if not route.wake_on_request or self.waker is None:
                raise deployment_paused(model, route.deployment_id, waking_in=None)
            waking_in = await self.waker.wake(route.deployment_id, team_id=key.team_id, estimate=route.ready_estimate)
            if waking_in is None:
                raise deployment_over_budget(model, route.deployment_id)
            raise deployment_paused(model, route.deployment_id, waking_in=waking_in)
        if route.status in STARTING and not route.problem:  # on its way (back) to serving: say when to come back
            seconds = ready_in(since=route.status_changed_at, estimate=route.ready_estimate, now=time.time())
            raise unavailable(f"The deployment serving `{model}` is {route.status}; it is expected to serve in about "
                              f"{seconds}s: retry after that.", retry_after=seconds)
        if not route.serving:
            raise unavailable(route.problem or f"The deployment serving `{model}` is {route.status.replace('_', ' ')}"
                                               f"{'' if route.current.urls else ' and has no endpoint yet'}; try again later.")
        if not route.open_to(key) and route.closed:
            raise unavailable(f"The deployment serving `{model}` is not open: {route.closed}", code="kv_not_on_efa")
        if not route.open_to(key):
            raise unavailable(f"The deployment serving `{model}` is up; Tandem is checking its OpenAI behaviour "
                              "before opening it (usually under a minute). Try again shortly.",
                              code="endpoint_checking")
        return route

    async def models(self, key) -> list[Route]:
        routes = await self.cache.get(key.team_id)
        return [r for r in routes.by_model.values() if r.open_to(key) and key.allows(r.deployment_id)]
