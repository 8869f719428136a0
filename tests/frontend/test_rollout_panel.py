"""The deployment page's rollout panel: the update rolling out (mode, the verdict's reasons, each step with its
state, replicas old/new per pool, peak surge, each judged step's evidence) and the last finished one; team admins
pause, resume and abort it through the services, members see no buttons and are refused."""
import pytest
from django.urls import reverse

from deployments.models import Event, Rollout
from deployments.services.rollouts import rollout_record
from tests.support.rollouts import rollout_at_step, rollout_started

pytestmark = pytest.mark.django_db

EVIDENCE = {"weight": 10, "verdict": "ok", "new": {"ttft_p50_ms": 85}}


@pytest.fixture
def rollout(team, team_admin, cluster):
    r = rollout_started(team=team, cluster=cluster, admin=team_admin)
    return rollout_at_step(r, 1, 50, replicas={"old": {"prefill": 1, "decode": 2}, "new": {"prefill": 1, "decode": 0}},
                           peak_surge={"prefill": 1, "decode": 0}, steps_log=[EVIDENCE])


def page(client, r: Rollout) -> str:
    return client.get(reverse("frontend:deployment-detail", args=[r.deployment_id])).content.decode()


def panel(html: str, r: Rollout) -> str:
    start = html.index(f'data-rollout="{r.pk}"')
    return html[start:html.index('<h3 class="mt-18">Timeline</h3>', start)]


def action(r: Rollout, name: str) -> str:
    return reverse(f"frontend:rollout-{name}", args=[r.deployment_id, r.pk])


def test_the_page_shows_each_step_the_replicas_and_the_evidence(signed_in, member, rollout):
    shown = panel(page(signed_in(member), rollout), rollout)
    assert "Rolling out: generation 1 → 2" in shown and "Side by side" in shown
    assert "<li>model.id changed (llama-3-8b → llama-3-8b-v2)</li>" in shown
    assert [s.split("</li>")[0] for s in shown.split("<li data-step-state=")[1:]] == [
        '"done">10% — done', '"current">50% — current: 50% of requests on generation 2', '"waiting">100% — waiting']
    assert ('<tr data-pool="prefill"><td>prefill</td><td>1</td><td>1</td><td>1</td></tr>' in shown and
            '<tr data-pool="decode"><td>decode</td><td>2</td><td>0</td><td>0</td></tr>' in shown)
    assert "<dt>verdict</dt><dd><code>ok</code></dd>" in shown
    assert "<dt>new</dt><dd><code>{&quot;ttft_p50_ms&quot;: 85}</code></dd>" in shown
    assert "<form" not in shown  # a member steers nothing


def test_the_live_status_panel_carries_the_rollout(signed_in, member, rollout, htmx_headers):
    """The panel is part of what polls while the deployment updates, so its steps move without a reload."""
    fragment = signed_in(member).get(reverse("frontend:deployment-status", args=[rollout.deployment_id]),
                                     headers=htmx_headers("status-panel")).content.decode()
    assert 'hx-trigger="every 2s"' in fragment and f'data-rollout="{rollout.pk}"' in fragment


def test_an_admin_pauses_resumes_and_aborts_with_a_reason(signed_in, team_admin, rollout):
    client = signed_in(team_admin)
    shown = panel(page(client, rollout), rollout)
    assert f'action="{action(rollout, "pause")}"' in shown and f'action="{action(rollout, "abort")}"' in shown
    assert 'name="reason" required' in shown and 'name="csrfmiddlewaretoken"' in shown

    response = client.post(action(rollout, "pause"))
    assert response.status_code == 302 and response["Location"].endswith(f"/deployments/{rollout.deployment_id}/")
    rollout.refresh_from_db()
    assert rollout.paused is True
    shown = panel(page(client, rollout), rollout)
    assert "Shifting, paused" in shown and f'action="{action(rollout, "resume")}"' in shown
    assert f'action="{action(rollout, "pause")}"' not in shown

    client.post(action(rollout, "resume"))
    rollout.refresh_from_db()
    assert rollout.paused is False
    client.post(action(rollout, "abort"), {"reason": "the new weights answer in French"})
    rollout.refresh_from_db()
    assert rollout.state == "rolling_back" and rollout.reason.endswith(": the new weights answer in French")
    assert Event.objects.filter(deployment_id=rollout.deployment_id, kind="rollout_aborted").count() == 1
    shown = panel(page(client, rollout), rollout)
    assert "<form" not in shown  # rolling back: nothing left to pause or abort


def test_a_member_posting_anyway_is_refused_and_nothing_changes(signed_in, member, rollout):
    client = signed_in(member)
    response = client.post(action(rollout, "abort"), {"reason": "x"}, follow=True)
    assert "Only an admin of the deployment&#x27;s team" in response.content.decode()
    rollout.refresh_from_db()
    assert (rollout.state, rollout.paused) == ("shifting", False)


def test_another_teams_rollout_is_a_404(signed_in, outsider, rollout):
    client = signed_in(outsider)
    assert client.post(action(rollout, "pause")).status_code == 404
    assert client.get(reverse("frontend:deployment-detail", args=[rollout.deployment_id])).status_code == 404


def test_actions_are_post_only(signed_in, team_admin, rollout):
    assert signed_in(team_admin).get(action(rollout, "pause")).status_code == 405


def test_the_last_finished_rollout_stays_on_the_page_with_why(signed_in, member, rollout):
    rollout_record(rollout=rollout, state=Rollout.State.ROLLED_BACK,
                   reason="Generation 2's median time to first token was 2.1× the old one's (allowed 1.5×).")
    html = page(signed_in(member), rollout)
    shown = panel(html, rollout)
    assert "Last rollout: generation 1 → 2" in shown and "Rolled Back" in shown
    assert "2.1× the old one&#x27;s" in shown
    assert [s.split('"')[1] for s in shown.split("<li data-step-state=")[1:]] == ["done", "stopped", "skipped"]
    assert "Rolling out:" not in html
