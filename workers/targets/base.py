"""The contract every target driver keeps, and the errors that classify what went wrong."""
from dataclasses import dataclass, field

from deployments.spec import DeploymentSpec
from workers.diagnosis import Finding, serve_findings


class TransientError(Exception):
    """Worth retrying: conflicts, throttling, 5xx, timeouts. `retry_after` is a hint in seconds."""

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(Exception):
    """Retrying will not help; the message tells the user what to change."""


@dataclass
class Step:
    """The outcome of one provisioning step, recorded as an event with its duration."""

    ready: bool
    message: str = ""


@dataclass
class Observed:
    """What exists on the target for a deployment."""

    exists: bool
    applied_hash: str = ""
    serve_status: str = ""  # RUNNING, DEPLOYING, DEPLOY_FAILED, UNHEALTHY, NOT_STARTED, "" when absent
    message: str = ""
    endpoint_url: str = ""  # the OpenAI-compatible base URL the gateway forwards to, e.g. http://host:8000
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AppUnit:
    """One application of a deployment: the generation its name carries (0: the deployment's first application,
    no suffix: deployments.serve_config.serve_app_name), the spec it runs, and fixed replicas per pool (None: the
    spec's autoscaling bounds). Outside a side-by-side rollout a deployment has one, `live_unit`; during one, the
    old generation's and the new one's (workers.rollout)."""

    app_generation: int
    spec: DeploymentSpec
    replicas: dict[str, int] | None = None
    port_half: int = 0  # which half of the deployment's NIXL port block it binds on a shared Ray cluster


def live_unit(deployment) -> AppUnit:
    """The application that serves the deployment's spec outside a rollout."""
    return AppUnit(app_generation=deployment.app_generation, spec=deployment.spec_typed,
                   port_half=deployment.app_port_half)


class Target:
    """One driver per cluster kind. Every method is safe to call repeatedly."""

    def __init__(self, cluster):
        self.cluster = cluster

    @property
    def config(self):
        """The cluster's typed config (deployments.cluster_config), as it is now."""
        return self.cluster.config_typed

    def ensure_node_pools(self, deployment, extra: dict[str, int] | None = None) -> Step:
        """Make the deployment's node pools hold its spec's replicas plus `extra` per pool (a rollout's surge
        while two generations run: workers.rollout); ready=True once they do."""
        return Step(ready=True, message="No node pools to manage on this target.")

    def desired(self, deployment, unit: AppUnit | None = None) -> tuple[object, str]:
        """The unit's objects to apply and their content hash (None: the live unit's)."""
        raise NotImplementedError

    def observe(self, deployment, desired=None, unit: AppUnit | None = None) -> Observed:
        """What exists for the unit (None: the live one), compared with `desired` (what `desired()` returned,
        passed by a pass that built it already; built here when None)."""
        raise NotImplementedError

    def endpoint_url(self, deployment, unit: AppUnit | None = None) -> str:
        """Where the unit answers (None: the live one), whether or not it runs yet."""
        raise NotImplementedError

    def apply(self, deployment, desired) -> Step:
        """Make the target hold `desired`; the Step's message says what changed (the pipeline records it)."""
        raise NotImplementedError

    def teardown(self, deployment, unit: AppUnit | None = None) -> Step:
        """Remove what the unit created (None: every application of the deployment, and what they share);
        ready=True once nothing is left."""
        raise NotImplementedError

    def pause(self, deployment) -> Step:
        """Remove the serving part and keep what a resume reuses; ready=True once nothing of it runs. Where
        nothing is worth keeping, that is the teardown."""
        return self.teardown(deployment)

    def restart_stage(self, deployment, stage: str) -> Step:
        """Replace the replicas of one stage ("prefill" or "decode") with new ones (at least those: the ray target
        replaces the whole application's); ready=True once asked. Where the target cannot, ready=False and the
        message says so (the pipeline records it)."""
        return Step(ready=False, message=f"This target cannot restart the {stage} replicas on its own; restart "
                                         "them by hand.")

    def preflight(self, deployment) -> None:
        """Refuse, with PermanentError, what the target would only refuse after minutes of retries."""

    def engine_logs(self, deployment) -> dict[str, str] | None:
        """The recent log text of each stage's engines ({"prefill": ..., "decode": ...}), where the target can read
        them; None where it cannot (observability.fabric reads which NIXL backend they use)."""
        return None

    def diagnose(self, deployment, observed: Observed) -> list[Finding]:
        """What the target reports wrong with an application that exists and does not serve (workers.diagnosis):
        here what Serve says of its deployments (`observed.details["serve_app"]`); a driver that can read more
        (pods, containers) adds it. A Ray cluster may grow, so no placement is judged hopeless here."""
        return serve_findings(observed.details.get("serve_app") or {}, cluster_complete=False)

    def endpoint_answers(self, deployment, observed: Observed) -> Step:
        return Step(ready=bool(observed.endpoint_url), message=observed.endpoint_url)
