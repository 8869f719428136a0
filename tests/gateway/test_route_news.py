"""Every change that opens or closes an endpoint reaches every gateway replica within a second of its commit, as a
key's revocation does; the route cache's expiry is only the fallback."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from deployments.conditions import conformance_passed, endpoint_ready
from deployments.lifecycle import Status
from deployments.services.actions import deployment_transition
from deployments.services.pause import deployment_pause
from deployments.services.status import deployment_observe
from tests.gateway.conftest import start_gateway
from tests.gateway.test_errors import CHAT, assert_openai_error, post
from tests.support.processes import wait_for

BOUND_S = 1.0  # issue 28: "applied by every gateway replica within a second"


@pytest.fixture(scope="module")
def replicas(django_db_setup, django_db_blocker, mock_upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    with ThreadPoolExecutor(2) as pool:
        members = list(pool.map(lambda _: start_gateway(tmp), range(2)))
    yield members
    for member in members:
        member.stop()


def _code(response) -> str | None:
    return response.json()["error"]["code"] if response.status_code >= 400 else None


def test_a_pause_is_seen_by_every_gateway_replica_within_a_second(world, replicas):
    dep = world.deployment("busy")
    _, raw = world.key()
    # Each replica has just loaded the team's routes: only the announcement can tell it before they expire.
    assert [post(gw, raw, {"model": "busy", **CHAT}).status_code for gw in replicas] == [200, 200]

    deployment_pause(actor=None, deployment=dep, reason="Idle.")
    deployment_transition(deployment=dep, to=Status.PAUSED, reason="Paused.")  # how the worker's pausing pass ends

    answers = {}

    def every_replica_says_paused():
        for i, gw in enumerate(replicas):
            if i not in answers:
                r = post(gw, raw, {"model": "busy", **CHAT})
                if _code(r) == "deployment_paused":
                    answers[i] = r
        return len(answers) == len(replicas)

    wait_for(every_replica_says_paused, timeout=BOUND_S, every=0.05, what="both replicas answering deployment_paused")
    for r in answers.values():
        error = assert_openai_error(r, 503, "deployment_paused")
        assert f"POST /api/v1/deployments/{dep.pk}/resume/" in error["message"]


def test_a_conformance_result_that_opens_an_endpoint_is_seen_within_a_second(world, replicas):
    dep = world.deployment("fresh")
    pending = endpoint_ready([], generation=dep.generation, answers=True)
    deployment_observe(deployment_id=dep.pk, condition_updates={"EndpointReady": pending | {
        "generation": dep.generation}})
    _, raw = world.key()
    assert [_code(post(gw, raw, {"model": "fresh", **CHAT})) for gw in replicas] == ["endpoint_checking"] * 2

    # What the pass after the run writes (workers.pipeline): the check passed, so the endpoint opens.
    checked = conformance_passed(passed=True, summary="12/12 checks passed.", pd_health=None)
    opened = endpoint_ready([{"type": "ConformancePassed", "status": "True", "reason": checked["reason"],
                              "observed_generation": dep.generation}], generation=dep.generation, answers=True)
    assert opened["status"] is True
    deployment_observe(deployment_id=dep.pk, condition_updates={
        "ConformancePassed": checked | {"generation": dep.generation},
        "EndpointReady": opened | {"generation": dep.generation}})

    wait_for(lambda: all(post(gw, raw, {"model": "fresh", **CHAT}).status_code == 200 for gw in replicas),
             timeout=BOUND_S, every=0.05, what="both replicas serving the opened endpoint")
