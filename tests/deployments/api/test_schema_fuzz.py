"""Schemathesis over the OpenAPI schema against the real web process: every check (status codes, content types,
headers and bodies against the schema, negative data refused, positive data accepted, auth, stateful links), with
a fixed seed so a failure reproduces. README ("The API contract") says how to run a larger run by hand."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.event_kinds import EventKind
from deployments.lifecycle import Status
from deployments.models import AccessToken, Membership
from deployments.services.api_keys import api_key_create
from deployments.services.credentials import credential_mint
from deployments.services.events import event_record
from deployments.services.spec_store import deployment_proposal_set
from deployments.spec import spec_parse
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, UserFactory, spec_input
from tests.support.processes import start_web

CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = 20261201
POSITIVE_PHASES = "examples,coverage,fuzzing"
EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "20"))


@pytest.fixture
def world(transactional_db, redis_client):
    """A platform admin (in no team: removing a member never offboards them mid-run), and a team with a member
    and something of every kind to read, approve and change."""
    admin = UserFactory(username="fuzz-admin", is_staff=True, is_superuser=True)
    team = MembershipFactory(role=Membership.Role.MEMBER, team__allow_self_approval=True).team
    cluster = ClusterFactory()
    DeploymentFactory(team=team, cluster=cluster, requested_by=admin)
    running = DeploymentFactory(team=team, cluster=cluster, requested_by=admin, name="running", status=Status.RUNNING)
    proposed = spec_parse(spec_input(engine={"max_model_len": 4096}), target_kind=cluster.kind).to_dict()
    deployment_proposal_set(deployment=running, spec=proposed, by=admin)
    running.save()
    event_record(kind=EventKind.TEAM_UPDATED, team=team, actor=admin, message="an event of the team, of no deployment")
    api_key_create(actor=admin, team=team, name="fuzz-key")
    # A run may revoke any token of its user it can name (DELETE /tokens/{id}/): decoys take the small ids a
    # generator tries first.
    for n in range(20):
        credential_mint(model=AccessToken, user=admin, name=f"decoy-{n}")
    return credential_mint(model=AccessToken, user=admin, name="fuzz")[1], running.pk


def _fresh_admin_token() -> str:
    """A token of a new platform admin, minted after the first run: whatever that run revoked, removed or
    offboarded, the second starts signed in."""
    admin = UserFactory(is_staff=True, is_superuser=True)
    return credential_mint(model=AccessToken, user=admin, name="fuzz")[1]


def _schemathesis(web, token: str, config: Path, mode: str, report: Path, phases: str, *extra: str):
    return subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(config),
         "run", f"{web.base_url}/api/schema/?format=json", "--checks", "all", "--mode", mode, "--seed", str(SEED),
         "--max-examples", str(EXAMPLES), "--workers", "1", "--suppress-health-check", "all", "--phases", phases,
         "--header", f"Authorization: Bearer {token}", "--report-dir", str(report), *extra],
        capture_output=True, text=True, timeout=600)


# Three runs of about 7,000 cases in all (the typed spec's every field is a case of its own), each with its own 600 s
# limit: longer than the suite's 300 s per test on a loaded machine.
@pytest.mark.timeout(1200)
def test_the_api_keeps_its_schema(world, tmp_path):
    token, deployment_id = world
    # Positive cases: a deployment's paths name the running one, so its actions reach their rules instead of only
    # 404. Negative cases: ids as generated (a fixed id would stand in for the invalid one they must send).
    positive = tmp_path / "positive.toml"
    positive.write_text(CONFIG.read_text() + '\n[[operations]]\ninclude-path-regex = "^/api/v1/deployments/\\\\{id\\\\}/"\n'
                        f'parameters = {{ "path.id" = {deployment_id} }}\n'
                        # Revoking a token by a guessed id could revoke the run's own and sign it out half-way
                        # (ids are not reset between tests); the negative run still sends it invalid ids.
                        '\n[[operations]]\ninclude-name = "DELETE /api/v1/tokens/{id}/"\nenabled = false\n')
    web = start_web(tmp_path)
    try:
        runs = [_schemathesis(web, token, positive, "positive", tmp_path / "positive", POSITIVE_PHASES),
                # Stateful steps are valid requests, so "schema-violating request accepted" has nothing to judge
                # there; schemathesis 4.32 still applied it to positive steps ("Invalid component: positive test
                # case" on a 200). Every other check runs on them.
                _schemathesis(web, token, positive, "positive", tmp_path / "stateful", "stateful",
                              "--exclude-checks", "negative_data_rejection")]
        # It tested signed in to the end (no 401 took over half-way: its token was out of its own reach).
        assert AccessToken.objects.filter(user__username="fuzz-admin", name="fuzz", revoked_at=None).exists()
        # Stateful sequences are for valid data: a chain of invalid requests reaches nothing.
        runs.append(_schemathesis(web, _fresh_admin_token(), CONFIG, "negative", tmp_path / "negative",
                                  POSITIVE_PHASES))
    finally:
        web.stop()
    for run in runs:
        assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
        print(*[line for line in run.stdout.splitlines() if "generated" in line or "Links" in line], sep="\n")
