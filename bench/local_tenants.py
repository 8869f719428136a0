"""Two teams share the real local Ray cluster: each deploys `chat` serving model `tiny-llama`, from its own weights
(two tiny models with different random weights). Each keeps answering with its own weights through the gateway,
at its own route prefix, and one team's teardown leaves the other's application running.

    ./tandem test bench/local_tenants.py -m pd -s       # or, with the suite's environment set up by hand:
    .venv/bin/python -m pytest -p no:cacheprovider -m pd -s bench/local_tenants.py

Moved out of the suite (it was its longest test after the PD end-to-end one: two more deployments, four vLLM
engines loaded on CPU, about 4 minutes of a 2-core machine) to keep the whole suite under 20 minutes. The suite
still proves what it rests on: deployments of one name in two teams each at its own route prefix, and two
workers deploying at once keeping each other's application (tests/workers/test_ray_target.py, against the
stand-in Serve REST API), every route refusing the other team (tests/test_two_tenants.py), and one deployment's
whole real path (tests/e2e/test_local_pd.py). It prints the Ray session's memory with none, two and one
deployments; bench/README.md records a run.
"""
import os
import re
from pathlib import Path

import httpx
import pytest
from openai import InternalServerError, OpenAI
from rest_framework.test import APIClient

from deployments.conditions import condition_get
from deployments.lifecycle import STARTING
from deployments.models import Cluster, Deployment, Membership
from tests.conftest import redis_client  # noqa: F401 - a fixture
from tests.e2e.conftest import (MODEL, local_cluster_config, local_ray, no_application_outlives_its_test,  # noqa: F401
                                ray_apps, session_processes, tiny_variant)
from tests.e2e.test_local_pd import status_of
from tests.factories import MembershipFactory, TeamFactory, UserFactory, local_spec_input
from tests.support.processes import Worker, start_gateway, stop_at_end, wait_for, worker_environment  # noqa: F401

pytestmark = [pytest.mark.pd, pytest.mark.e2e, pytest.mark.timeout(1800)]
PROMPT = [{"role": "user", "content": "Tell me about the cluster."}]


def ray_memory(head_pid: int) -> dict:
    """RSS and PSS (shared pages split between sharers) summed over the Ray head's session: every Ray, Serve and
    vLLM process of the local cluster, in GiB."""
    rss = pss = 0
    for pid in session_processes(os.getsid(head_pid)):
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # ended since
            continue
        rss += int(re.search(r"^Rss:\s+(\d+)", rollup, re.M)[1])
        pss += int(re.search(r"^Pss:\s+(\d+)", rollup, re.M)[1])
    return {"rss_gib": round(rss / 2**20, 2), "pss_gib": round(pss / 2**20, 2)}


def answered(base_url: str, api_key: str) -> str:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny-llama", messages=PROMPT, max_tokens=8, temperature=0)
    return chat.choices[0].message.content


def _answered_or_none(base_url: str, api_key: str) -> str | None:
    """The answer, or None while the gateway still says the endpoint is being checked."""
    try:
        return answered(base_url, api_key)
    except InternalServerError as e:
        if "checking its OpenAI behaviour" in str(e):
            return None
        raise


def test_two_teams_share_one_ray_cluster_each_with_its_own_weights(transactional_db, redis_client, local_ray,
                                                                    tiny_variant, tmp_path, stop_at_end):
    teams = {"team-a": MODEL, "team-b": tiny_variant}
    Cluster.objects.create(name="local", kind=Cluster.Kind.RAY, secret_ref=local_ray["secret_ref"],
                           config=local_cluster_config(local_ray, model_sources={"teams": {
                               slug: {"paths": [str(path)]} for slug, path in teams.items()}}))
    approver = UserFactory(is_staff=True, is_superuser=True)
    gateway = stop_at_end(start_gateway(tmp_path))
    stop_at_end(Worker(worker_environment(tmp_path, TANDEM_GATEWAY_BASE_URL=f"{gateway.base_url}/v1",
                                      TANDEM_TASK_TIME_LIMIT="300")).start())
    api, pks, keys = APIClient(), {}, {}
    memory = {"idle": ray_memory(local_ray["pid"])}
    try:
        for slug, weights in teams.items():  # the same deployment name and model id in both teams
            member = MembershipFactory(team=TeamFactory(slug=slug, gpu_quota=0), role=Membership.Role.MEMBER).user
            api.force_authenticate(member)
            spec = local_spec_input(model={"id": "tiny-llama", "source": str(weights)},
                                    engine={"max_model_len": 1024, "dtype": "bfloat16"})
            r = api.post("/api/v1/deployments/", {"team": slug, "cluster": "local", "name": "chat", "spec": spec},
                         format="json")
            assert r.status_code == 201, r.json()
            pks[slug] = r.json()["id"]
            keys[slug] = api.post("/api/v1/api-keys/", {"team": slug, "name": "e2e"}, format="json").json()["secret"]
        api.force_authenticate(approver)
        for pk in pks.values():
            approval = {"generation": Deployment.objects.get(pk=pk).generation}  # bound to what was reviewed
            assert api.post(f"/api/v1/deployments/{pk}/approve/", approval, format="json").status_code == 200

        # Both run side by side, each opened for its users by its own conformance run through the gateway.
        for slug, pk in pks.items():
            wait_for(lambda: status_of(pk) not in STARTING, timeout=1200, every=2, what=f"{slug} running")
            wait_for(lambda: (condition_get(Deployment.objects.get(pk=pk).conditions, "EndpointReady") or {})
                     .get("status") == "True", timeout=600, every=2, what=f"{slug}'s endpoint opened")
        memory["both"] = ray_memory(local_ray["pid"])
        endpoints = {slug: Deployment.objects.get(pk=pk).endpoint_url for slug, pk in pks.items()}
        assert endpoints == {slug: f"{local_ray['serve_http_url']}/d/{pk}" for slug, pk in pks.items()}
        apps = ray_apps(local_ray)
        assert {f"tdm-{pk}-chat" for pk in pks.values()} <= set(apps)

        # Each team's key is answered by its own weights (the two models answer differently, deterministically).
        direct = {slug: answered(f"{url}/v1", "unused") for slug, url in endpoints.items()}
        assert direct["team-a"] != direct["team-b"], direct
        # The gateway sees an endpoint open once its route cache refreshes (gateway.config route_ttl_s, 2 s).
        through_gateway = {slug: wait_for(lambda: _answered_or_none(f"{gateway.base_url}/v1", keys[slug]),
                                          timeout=30, every=1, what=f"{slug} answered through the gateway")
                           for slug in teams}
        assert through_gateway == direct
        print(f"\nanswers: {direct}")

        # Team B's teardown removes B's application only: A's keeps running and answering with A's weights.
        api.force_authenticate(Membership.objects.get(team__slug="team-b").user)
        assert api.delete(f"/api/v1/deployments/{pks['team-b']}/").status_code == 202
        wait_for(lambda: status_of(pks["team-b"]) == "deleted", timeout=300, every=1, what="team-b deleted")
        apps = ray_apps(local_ray)
        assert f"tdm-{pks['team-b']}-chat" not in apps
        assert apps[f"tdm-{pks['team-a']}-chat"]["status"] == "RUNNING"
        assert answered(f"{gateway.base_url}/v1", keys["team-a"]) == direct["team-a"]
        memory["one"] = ray_memory(local_ray["pid"])
        assert httpx.get(f"{endpoints['team-b']}/v1/models", timeout=10).status_code == 404

        api.force_authenticate(Membership.objects.get(team__slug="team-a").user)
        assert api.delete(f"/api/v1/deployments/{pks['team-a']}/").status_code == 202
        wait_for(lambda: status_of(pks["team-a"]) == "deleted", timeout=300, every=1, what="team-a deleted")
        assert ray_apps(local_ray) == {}
    finally:
        print(f"\nRay session memory (GiB): {memory}")
