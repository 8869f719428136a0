"""Pause and wake on the real local PD stack: a running deployment is paused (its Ray Serve application removed, no
quota held), a request through the gateway gets the OpenAI-shaped 503 and wakes it, and once it is running again
(checked by a fresh conformance run) the next request is answered through the gateway. Prints the times."""
import time

import httpx
import pytest
from openai import InternalServerError, OpenAI
from rest_framework.test import APIClient

from deployments.conditions import condition_get
from deployments.lifecycle import HOLDS_QUOTA
from deployments.models import Cluster, Deployment, Membership
from tests.e2e.conftest import MODEL, local_cluster_config
from tests.e2e.test_local_pd import ray_apps, status_of
from tests.factories import MembershipFactory, TeamFactory, UserFactory, local_spec_input
from tests.support.processes import Worker, start_gateway, wait_for, worker_environment

pytestmark = [pytest.mark.pd, pytest.mark.e2e, pytest.mark.timeout(1800)]
PROMPT = [{"role": "user", "content": "Wake up."}]
WAKE_TO_ANSWER_BOUND_S = 900  # generous: a cold start of both vLLM engines on CPU is a few minutes here


def _open(pk: int) -> bool:
    return (condition_get(Deployment.objects.get(pk=pk).conditions, "EndpointReady") or {}).get("status") == "True"


def _answer(base_url: str, key: str) -> str | None:
    """The answer through the gateway, or None while it still says the deployment is not open."""
    try:
        chat = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120).chat.completions.create(
            model="tiny-llama", messages=PROMPT, max_tokens=8, temperature=0)
    except InternalServerError as e:
        if e.status_code == 503:
            return None
        raise
    return chat.choices[0].message.content


def test_pause_frees_the_app_and_quota_and_a_request_wakes_it(transactional_db, redis_client, local_ray, tmp_path):
    team = TeamFactory(slug="ml-research", gpu_quota=0)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    Cluster.objects.create(name="local", kind=Cluster.Kind.RAY, secret_ref=local_ray["secret_ref"],
                           config=local_cluster_config(local_ray))
    gateway = start_gateway(tmp_path)
    worker = Worker(worker_environment(tmp_path, TANDEM_GATEWAY_BASE_URL=f"{gateway.base_url}/v1",
                                       TANDEM_TASK_TIME_LIMIT="300")).start()
    api, base = APIClient(), f"{gateway.base_url}/v1"
    times = {}
    try:
        api.force_authenticate(member)
        spec = local_spec_input(model={"id": "tiny-llama", "source": str(MODEL)},
                                engine={"max_model_len": 1024, "dtype": "bfloat16"},
                                pause={"wake_on_request": True})
        r = api.post("/api/v1/deployments/", {"team": team.slug, "cluster": "local", "name": "chat", "spec": spec},
                     format="json")
        assert r.status_code == 201, r.json()
        pk = r.json()["id"]
        key = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "e2e"}, format="json").json()["secret"]
        api.force_authenticate(UserFactory(is_staff=True, is_superuser=True))
        approval = {"generation": Deployment.objects.get(pk=pk).generation}
        assert api.post(f"/api/v1/deployments/{pk}/approve/", approval, format="json").status_code == 200
        wait_for(lambda: status_of(pk) in ("running", "failed"), timeout=1200, every=2, what="running")
        wait_for(lambda: _open(pk), timeout=600, every=2, what="endpoint opened")
        first = wait_for(lambda: _answer(base, key), timeout=60, every=1, what="answered before the pause")
        app = f"tdm-{pk}-chat"

        # Pause: the Serve application goes; the deployment, its key and its name stay; no quota is held.
        api.force_authenticate(member)
        started = time.monotonic()
        assert api.post(f"/api/v1/deployments/{pk}/pause/").status_code == 202
        wait_for(lambda: status_of(pk) == "paused", timeout=300, every=1, what="paused")
        times["pause_s"] = round(time.monotonic() - started, 1)
        assert app not in ray_apps(local_ray)
        assert not Deployment.objects.filter(team=team, status__in=HOLDS_QUOTA).exists()

        # A request wakes it: 503 deployment_paused with Retry-After from its own history. Until the gateway's
        # route cache (2 s) sees the pause, a request still goes where the application was (502: Serve has no
        # such route any more) or finds it pausing (503 deployment_not_running), and wakes nothing.
        def paused_answer():
            r = httpx.post(f"{base}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"model": "tiny-llama", "messages": PROMPT}, timeout=30)
            assert r.status_code in (502, 503), r.text
            return r if r.status_code == 503 and r.json()["error"]["code"] == "deployment_paused" else None

        r = wait_for(paused_answer, timeout=10, every=0.5, what="the gateway sees it paused")
        woke = time.monotonic()
        assert "waking it" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1
        times["retry_after_s"] = int(r.headers["retry-after"])
        wait_for(lambda: status_of(pk) in ("provisioning", "running"), timeout=30, every=0.5, what="woken")

        # Back to running, checked again by conformance, then answered through the gateway as before.
        wait_for(lambda: status_of(pk) in ("running", "failed"), timeout=WAKE_TO_ANSWER_BOUND_S, every=2,
                 what="running again")
        assert status_of(pk) == "running"
        again = wait_for(lambda: _answer(base, key), timeout=WAKE_TO_ANSWER_BOUND_S, every=1,
                         what="answered after the wake")
        times["wake_to_first_answer_s"] = round(time.monotonic() - woke, 1)
        assert again == first  # the same weights, greedy
        assert ray_apps(local_ray)[app]["status"] == "RUNNING"
        assert Deployment.objects.get(pk=pk).events.filter(kind="woken").count() == 1
        assert times["wake_to_first_answer_s"] < WAKE_TO_ANSWER_BOUND_S

        api.force_authenticate(member)
        assert api.delete(f"/api/v1/deployments/{pk}/").status_code == 202
        wait_for(lambda: status_of(pk) == "deleted", timeout=300, every=1, what="deleted")
    finally:
        print(f"\npause → wake → first answer: {times}")
        worker.stop()
        gateway.stop()
