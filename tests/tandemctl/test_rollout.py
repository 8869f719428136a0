"""`tandemctl rollout` as a user runs it, a subprocess against the real web process: a member reads the steps of
the update rolling out; a team admin pauses, resumes and aborts it; a member's attempt is refused with AUTH."""
import json

import pytest

from deployments.models import AccessToken, Membership, Rollout
from deployments.services.credentials import credential_mint
from deployments.services.rollouts import rollout_record
from tandemctl import errors
from tests.factories import ClusterFactory, MembershipFactory, TeamFactory
from tests.support.processes import start_web
from tests.support.rollouts import rollout_at_step, rollout_started
from tests.support.tandemctl import tandemctl

EVIDENCE = {"weight": 10, "verdict": "ok"}


@pytest.fixture
def rolling(transactional_db, redis_client, tmp_path):
    """The web process; ml-research's deployment, its update of the weights on its second step (50%)."""
    team = TeamFactory(slug="ml-research", gpu_quota=16)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    r = rollout_started(team=team, cluster=ClusterFactory(name="k8s-emu"), admin=admin)
    rollout_at_step(r, 1, 50, replicas={"old": {"prefill": 1, "decode": 1}, "new": {"prefill": 1, "decode": 1}},
                    peak_surge={"prefill": 1, "decode": 0}, steps_log=[EVIDENCE])
    proc = start_web(tmp_path)
    try:
        yield {"rollout": r, "ref": f"ml-research/{r.deployment.name}", "server": proc.base_url, "home": tmp_path,
               **{who: credential_mint(model=AccessToken, user=u, name="ci")[1]
                  for who, u in (("member", member), ("admin", admin))}}
    finally:
        proc.stop()


@pytest.mark.e2e
def test_a_member_reads_each_step_with_its_state(rolling):
    member = dict(token=rolling["member"], server=rolling["server"], home=rolling["home"])
    out = tandemctl("rollout", rolling["ref"], **member, check_rc=errors.OK).stdout.splitlines()
    assert out[:3] == [f"Rollout:     {rolling['rollout'].pk}: generation 1 → 2, side by side",
                       "State:       shifting, 50% of requests on generation 2",
                       "Verdict:     they cannot share KV: model.id changed (llama-3-8b → llama-3-8b-v2)"]
    assert out[3:8] == ["Steps:", "STEP  WEIGHT  STATE", "1     10%     done", "2     50%     current",
                        "3     100%    waiting"]
    assert out[8:] == ["Replicas:    old: prefill 1, decode 1; new: prefill 1, decode 1",
                       "Peak surge:  prefill 1, decode 0"]
    as_json = json.loads(tandemctl("rollout", rolling["ref"], "-o", "json", **member, check_rc=errors.OK).stdout)
    assert (as_json["weight"], as_json["steps_log"]) == (50, [EVIDENCE])
    refused = tandemctl("rollout", rolling["ref"], "--pause", **member, check_rc=errors.AUTH)
    assert "Only an admin of the deployment's team" in refused.stderr
    assert Rollout.objects.get(pk=rolling["rollout"].pk).paused is False


@pytest.mark.e2e
def test_an_admin_pauses_resumes_and_aborts_then_the_last_rollout_shows_why(rolling):
    admin = dict(token=rolling["admin"], server=rolling["server"], home=rolling["home"])
    ref, pk = rolling["ref"], rolling["rollout"].pk
    paused = tandemctl("rollout", ref, "--pause", **admin, check_rc=errors.OK)
    assert "held at its step" in paused.stderr and "shifting (paused), 50%" in paused.stdout
    assert Rollout.objects.get(pk=pk).paused is True
    tandemctl("rollout", ref, "--resume", **admin, check_rc=errors.OK)
    assert Rollout.objects.get(pk=pk).paused is False
    aborted = tandemctl("rollout", ref, "--abort", "p95 doubled", **admin, check_rc=errors.OK)
    assert "State:       rolling_back" in aborted.stdout
    r = Rollout.objects.get(pk=pk)
    assert r.state == "rolling_back" and r.reason.endswith(": p95 doubled")

    rollout_record(rollout=r, state=Rollout.State.ABORTED)  # the reconciler finished moving traffic back
    ended = tandemctl("rollout", ref, **admin, check_rc=errors.OK).stdout
    assert "State:       aborted" in ended and ended.rstrip().endswith(f"Reason:      {r.reason}")
    assert "2     50%     stopped" in ended and "3     100%    skipped" in ended
    nothing = tandemctl("rollout", ref, "--resume", **admin, check_rc=errors.CONFLICT)
    assert "is rolling out: nothing to resume" in nothing.stderr
