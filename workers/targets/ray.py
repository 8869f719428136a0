"""The `ray` target: an existing Ray cluster, driven through its dashboard's Serve REST API.

`PUT /api/serve/applications/` is declarative for the whole cluster: it removes every application it does not
list. So apply and teardown read what is deployed first and PUT everyone else's applications back unchanged.
Several teams share one cluster: each deployment is its own application, named by its primary key
(`tdm-<id>-<name>`; a name alone is unique only within a team), answering under its own route prefix (`/d/<id>`)
with its own NIXL ports, so Tandem only ever writes or removes the application that is this deployment's.
"""
import copy
import json
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
from django.db import connection, transaction
from django.utils import timezone

from deployments.hashing import content_hash
from deployments.model_sources import not_allowed_message, source_roots_of
from deployments.serve_config import ray_nixl_ports, ray_route_prefix, serve_app_name, serve_config_build
from workers import clients
from workers.targets.base import AppUnit, Observed, PermanentError, Step, Target, TransientError, live_unit
from workers.targets.serve_status import failure_cause, serve_app_message

APPS = "/api/serve/applications/"
# First key of the two-key advisory lock that serialises writes to one Ray cluster's applications (second: its id).
CLUSTER_LOCK_CLASS = 0x7A4E
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Set in a stage's runtime_env to make Serve replace its replicas (restart_stage); no engine reads it.
RESTART_ENV = "TANDEM_RESTARTED_AT"


def http_error(e: Exception, *, doing: str, cluster: str) -> Exception:
    """Classify a dashboard failure: network, 429 and 5xx are transient; auth and invalid config are not."""
    if isinstance(e, httpx.TransportError):
        return TransientError(f"Cannot reach the Ray dashboard of {cluster} while {doing}: {type(e).__name__}.")
    if not isinstance(e, httpx.HTTPStatusError):
        return e
    status, text = e.response.status_code, failure_cause(e.response.text, limit=500)
    if status == 429 or status >= 500:
        retry_after = e.response.headers.get("Retry-After", "")
        return TransientError(f"The Ray dashboard of {cluster} answered {status} while {doing}; retrying.",
                              retry_after=float(retry_after) if retry_after.isdigit() else None)
    if status in (401, 403):
        return PermanentError(f"The Ray dashboard of {cluster} refused Tandem's token ({status}): check the "
                              "cluster's secret reference holds the Ray auth token.")
    return PermanentError(f"The Ray dashboard of {cluster} rejected {doing} ({status}): {text}")


def _project(value, shape):
    """`value` cut down to the keys `shape` has, so defaults Ray fills in do not count as drift."""
    if isinstance(shape, dict) and isinstance(value, dict):
        return {k: _project(value.get(k), v) for k, v in shape.items()}
    if isinstance(shape, list) and isinstance(value, list) and len(shape) == len(value):
        return [_project(v, s) for v, s in zip(value, shape)]
    return value


class RayTarget(Target):
    """Drives a deployment onto an existing Ray cluster (the local target, or any reachable Ray)."""

    def __init__(self, cluster, *, http: httpx.Client | None = None, probe: httpx.Client | None = None):
        super().__init__(cluster)
        self._http = http
        self._probe = probe

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = clients.ray_dashboard_client(base_url=self.config.dashboard_url,
                                                      secret_ref=self.cluster.secret_ref)
        return self._http

    @property
    def serve_url(self) -> str:
        """Where Serve's HTTP proxy answers: the configured serve_url, else the dashboard's host on 8000."""
        if url := self.config.serve_url:
            return url.rstrip("/")
        host = urlsplit(self.config.dashboard_url).hostname
        return f"http://{host}:8000"

    def _request(self, method: str, doing: str, **kwargs) -> httpx.Response:
        try:
            response = self.http.request(method, APPS, **kwargs)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise http_error(e, doing=doing, cluster=self.cluster.name) from None
        return response

    def _deployed(self) -> dict:
        body = self._request("GET", "reading Serve applications").json()
        return body.get("applications") or {}

    @staticmethod
    def app_name(deployment, unit: AppUnit | None = None) -> str:
        g = (unit or live_unit(deployment)).app_generation
        return serve_app_name(deployment_id=deployment.pk, name=deployment.name, target_kind="ray", app_generation=g)

    def endpoint_url(self, deployment, unit: AppUnit | None = None) -> str:
        """Serve's proxy plus the application's route prefix: the gateway appends `/v1/...` to it."""
        g = (unit or live_unit(deployment)).app_generation
        return self.serve_url + ray_route_prefix(deployment_id=deployment.pk, app_generation=g)

    def desired(self, deployment, unit: AppUnit | None = None) -> tuple[dict, str]:
        unit = unit or live_unit(deployment)
        parts = urlsplit(self.serve_url)
        # Bind where the URL points when it is loopback (the local target); otherwise listen on all interfaces.
        host = parts.hostname if parts.hostname in LOOPBACK else "0.0.0.0"
        g = unit.app_generation
        config = serve_config_build(app_name=self.app_name(deployment, unit), spec=unit.spec,
                                    route_prefix=ray_route_prefix(deployment_id=deployment.pk, app_generation=g),
                                    nixl_ports=ray_nixl_ports(deployment_id=deployment.pk, half=unit.port_half),
                                    target_kind="ray", http_options={"host": host, "port": parts.port or 8000},
                                    replicas=unit.replicas)
        return config, content_hash(config["applications"][0])

    def observe(self, deployment, desired: dict | None = None, unit: AppUnit | None = None) -> Observed:
        config = desired if desired is not None else self.desired(deployment, unit)[0]
        app = self._deployed().get(config["applications"][0]["name"])
        if app is None or app.get("status") == "DELETING":  # being removed (out-of-band too): it is gone
            return Observed(exists=False)
        wanted = config["applications"][0]
        applied = content_hash(_project(app.get("deployed_app_config") or {}, wanted))
        return Observed(exists=True, applied_hash=applied, serve_status=app.get("status", ""),
                        message=serve_app_message(app), endpoint_url=self.endpoint_url(deployment, unit),
                        details={"serve_app": app})

    @staticmethod
    def _others(deployed: dict, names) -> list[dict]:
        """Every application not in `names` as it was deployed, to PUT back unchanged (one being deleted stays
        gone)."""
        return [a["deployed_app_config"] for n, a in deployed.items()
                if n not in names and a.get("deployed_app_config") and a.get("status") != "DELETING"]

    def _generations(self, deployed: dict, deployment) -> set[str]:
        """The names of every application of the deployment on the cluster, whichever generation they carry."""
        base = self.app_name(deployment, AppUnit(0, None))
        return {n for n in deployed if n == base or (n.startswith(base + "-g") and n[len(base) + 2:].isdigit())}

    def preflight(self, deployment) -> None:
        """On a Ray cluster on this machine, check a local model path before Serve spends minutes on it.

        Serve retries a failing replica three times, each loading vLLM, before DEPLOY_FAILED (about 4-5 minutes
        on a 2-core machine); a missing path or a max_model_len above the model's limit is known at once.
        """
        spec = deployment.spec_typed
        source = spec.model_source
        if not source.startswith("/") or urlsplit(self.config.dashboard_url).hostname not in LOOPBACK:
            return
        # Read only inside the model sources the cluster allows the team (by real path, as the spec was checked).
        roots = source_roots_of(cluster=self.cluster, team=deployment.team)
        if not roots.allows(source):
            raise PermanentError(f"model.source: {not_allowed_message(roots)}")
        config = roots.readable_file(source, "config.json")
        if config is None or not config.is_file():
            raise PermanentError(f"The model source {source} does not exist on the Ray cluster's machine (there is "
                                 "no config.json in it). Point model.source at a model directory and retry.")
        limit = json.loads(config.read_text()).get("max_position_embeddings")
        wanted = spec.engine.max_model_len
        if limit and wanted > limit:
            raise PermanentError(f"engine.max_model_len ({wanted}) is greater than the model's "
                                 f"max_position_embeddings ({limit}) in {config}; vLLM would refuse to start. "
                                 f"Use at most {limit}.")

    @contextmanager
    def _writing(self):
        """One read-then-PUT of this cluster's applications at a time, across workers: two passes that each PUT
        back what they read would otherwise drop each other's application (another team's, possibly)."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [CLUSTER_LOCK_CLASS, self.cluster.pk])
            yield

    def apply(self, deployment, desired: dict) -> Step:
        """PUT our application together with every other application already on the cluster."""
        name = desired["applications"][0]["name"]
        with self._writing():
            others = self._others(self._deployed(), {name})
            body = {**desired, "applications": [*others, *desired["applications"]]}
            self._request("PUT", "deploying the application", json=body)
        kept = f" (kept {len(others)} other application(s))" if others else ""
        return Step(ready=True, message=f"Deployed Serve application {name}{kept}.")

    def teardown(self, deployment, unit: AppUnit | None = None) -> Step:
        """Remove the unit's application (None: every generation's of the deployment); the others stay. Ready once
        the dashboard no longer lists them.

        Never `DELETE /api/serve/applications/`: it shuts Serve down, every team's applications with it, and an
        application someone else deploys in between would go too. A PUT of the others (possibly none) removes
        ours alone."""
        config, _ = self.desired(deployment, unit)  # the same cluster options as every apply
        with self._writing():
            deployed = self._deployed()
            names = {config["applications"][0]["name"]} if unit else self._generations(deployed, deployment)
            present = sorted(n for n in names if n in deployed)
            if not present:
                return Step(ready=True, message=f"Serve application {config['applications'][0]['name']} is gone."
                            if unit or len(names) <= 1 else "Every Serve application of the deployment is gone.")
            if any(deployed[n].get("status") != "DELETING" for n in present):
                self._request("PUT", "removing the application",
                              json={**config, "applications": self._others(deployed, names)})
        return Step(ready=False, message=f"Serve application {', '.join(present)} is being deleted.")

    def restart_stage(self, deployment, stage: str) -> Step:
        """PUT our application back with a new RESTART_ENV in `stage`'s runtime_env: a new version of the
        application, whose replicas Serve replaces. On Ray 2.60 that is every deployment of the PD application, not
        only `stage`'s (the builder's arguments changed; measured on the local PD stack, bench/README.md), so
        prefill restarts too. `observe` compares only what `desired` renders, so it is no drift, and the next apply
        of a changed spec drops it."""
        name = self.app_name(deployment)
        config, _ = self.desired(deployment)  # the same cluster options as every apply
        with self._writing():
            deployed = self._deployed()
            app = copy.deepcopy((deployed.get(name) or {}).get("deployed_app_config"))
            if not app:
                return Step(ready=False, message=f"Serve application {name} is not on the cluster.")
            runtime_env = app["args"][f"{stage}_config"].setdefault("runtime_env", {})
            runtime_env.setdefault("env_vars", {})[RESTART_ENV] = timezone.now().isoformat()
            self._request("PUT", f"restarting the {stage} replicas",
                          json={**config, "applications": [*self._others(deployed, name), app]})
        return Step(ready=True, message=f"Serve is replacing the replicas of {name} to restart its {stage}.")

    def endpoint_answers(self, deployment, observed: Observed) -> Step:
        """The OpenAI-compatible endpoint lists the deployment's model."""
        probe = self._probe or clients.http_client()
        try:
            response = probe.get(f"{observed.endpoint_url}/v1/models")
        except httpx.HTTPError as e:
            return Step(ready=False, message=f"{observed.endpoint_url} does not answer yet ({type(e).__name__}).")
        finally:
            if probe is not self._probe:
                probe.close()
        if response.status_code != 200:
            return Step(ready=False, message=f"{observed.endpoint_url}/v1/models answered {response.status_code}.")
        models = [m.get("id") for m in response.json().get("data", [])]
        model_id = deployment.spec_typed.model_id
        if model_id not in models:
            return Step(ready=False, message=f"{observed.endpoint_url} does not list {model_id} yet.")
        return Step(ready=True, message=f"{observed.endpoint_url} serves {model_id}.")
