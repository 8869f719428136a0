"""Request, edit, approve, reject, withdraw, retry, update, delete: who may, what changes, what is audited."""
import threading

import pytest
from django.db import connection

from deployments.errors import Conflict, NotAllowed, QuotaExceeded
from deployments.models import Deployment, Membership
from deployments.outcomes import Outcome
from deployments.services import actions
from deployments.services.pause import deployment_pause
from deployments.services.status import RECONCILE_TASK
from deployments.spec import SpecError
from deployments.spec_diff import FieldChange
from tests.factories import DeploymentFactory, MembershipFactory, UserFactory, spec_input
from tests.support.broker import queued

pytestmark = pytest.mark.django_db


def small(**pool):
    """A spec with `pool` overrides on both pools (default: 4 GPUs each)."""
    p = {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4, **pool}
    return spec_input(prefill=dict(p), decode=dict(p))


def request(user, team, cluster, name="llama", spec=None):
    return actions.deployment_request(actor=user, team=team, cluster=cluster, name=name, spec=spec or small())


def reviewed(d) -> dict:
    """What an approver who opens the deployment now sees: its generation and proposed spec."""
    d.refresh_from_db()
    return {"generation": d.generation, "proposed_hash": d.proposed_spec_hash}


def approve(actor, d, **kw):
    return actions.deployment_approve(actor=actor, deployment=d, **reviewed(d), **kw)


def reject(actor, d, **kw):
    return actions.deployment_reject(actor=actor, deployment=d, **reviewed(d), **kw)


def test_member_requests_and_the_audit_trail_says_so(member, team, cluster):
    d = request(member, team, cluster)
    assert d.status == "pending_approval" and d.generation == 1
    assert d.spec["prefill"]["gpus_per_node"] == 4 and d.spec["runtime"] == "ray-2.60.0-vllm-0.29.0"
    e = d.events.get()
    assert (e.kind, e.actor) == ("requested", member)
    assert e.after["spec"]["model_id"] == "llama-3-8b"


def test_outsider_cannot_request(team, cluster):
    with pytest.raises(NotAllowed):
        request(UserFactory(), team, cluster)


def test_bad_name_and_bad_spec_are_reported_per_field(member, team, cluster):
    spec = small(tensor_parallel_size=3)
    with pytest.raises(SpecError) as e:
        request(member, team, cluster, name="Llama_8B", spec=spec)
    assert "DNS-1123" in e.value.errors["name"][0]
    assert "does not divide" in e.value.errors["spec.prefill.tensor_parallel_size"][0]
    assert not Deployment.objects.exists()


def test_quota_is_checked_at_request_with_the_numbers(member, team, cluster):
    team.gpu_quota = 6
    team.save()
    with pytest.raises(QuotaExceeded) as e:
        request(member, team, cluster)
    assert "needs 8 GPUs" in e.value.message and "6-GPU quota" in e.value.message


def test_duplicate_live_name_is_a_conflict_but_a_withdrawn_name_is_reusable(member, team, cluster):
    d = request(member, team, cluster)
    with pytest.raises(Conflict):
        request(member, team, cluster)
    actions.deployment_withdraw(actor=member, deployment=d)
    assert request(member, team, cluster).name == "llama"


def test_admin_approves_and_reconcile_is_enqueued_after_commit(member, team_admin, team, cluster,
                                                               django_capture_on_commit_callbacks, redis_client):
    d = request(member, team, cluster)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        d = approve(team_admin, d, comment="ok for the eval")
    assert d.status == "approved" and queued(redis_client, task=RECONCILE_TASK) == []
    for callback in callbacks:
        callback()
    assert queued(redis_client, task=RECONCILE_TASK) == [[d.pk]]
    assert d.events.filter(kind="approved", actor=team_admin, message="ok for the eval").exists()


def test_member_cannot_approve_and_requester_cannot_self_approve(member, team_admin, team, cluster):
    d = request(member, team, cluster)
    with pytest.raises(NotAllowed):
        approve(member, d)
    mine = request(team_admin, team, cluster, name="admins-own")
    with pytest.raises(NotAllowed, match="another admin"):
        approve(team_admin, mine)
    team.allow_self_approval = True
    team.save()
    assert approve(team_admin, mine).status == "approved"


def test_platform_admin_approves_anything(member, platform_admin, team, cluster):
    d = request(member, team, cluster)
    assert approve(platform_admin, d).status == "approved"


def test_approval_refused_over_quota(member, team_admin, team, cluster):
    a = request(member, team, cluster, name="a")
    b = request(member, team, cluster, name="b")
    approve(team_admin, a)
    with pytest.raises(QuotaExceeded, match="already holds 8 of its 16"):
        approve(team_admin, DeploymentFactory(
            team=team, cluster=cluster, requested_by=member, name="c",
            spec={**a.spec, "prefill": {**a.spec["prefill"], "nodes": 2}}))
    assert approve(team_admin, b).status == "approved"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_approvals_cannot_both_pass_the_quota(team, cluster):
    team.gpu_quota = 8
    team.save()
    member = MembershipFactory(team=team).user
    admins = [MembershipFactory(team=team, role=Membership.Role.ADMIN).user for _ in range(2)]
    ds = [request(member, team, cluster, name=f"race-{i}") for i in range(2)]
    barrier, outcomes = threading.Barrier(2), []

    def decide(i):
        barrier.wait()
        try:
            approve(admins[i], ds[i])
            outcomes.append("approved")
        except QuotaExceeded:
            outcomes.append("quota")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["approved", "quota"]
    assert Deployment.objects.filter(status="approved").count() == 1


def test_reject_with_comment(member, team_admin, team, cluster):
    d = reject(team_admin, request(member, team, cluster), comment="too big")
    assert (d.status, d.status_reason) == ("rejected", "too big")
    with pytest.raises(Conflict):
        approve(team_admin, d)


def test_edit_pending_bumps_generation_and_records_before_after(member, team, cluster):
    d = request(member, team, cluster)
    d = actions.deployment_edit(actor=member, deployment=d, spec=small(nodes=2))
    assert d.generation == 2 and d.spec["prefill"]["nodes"] == 2
    e = d.events.get(kind="edited")
    assert e.before["spec"]["prefill"]["nodes"] == 1 and e.after["spec"]["prefill"]["nodes"] == 2
    assert actions.deployment_edit(actor=member, deployment=d, spec=small(nodes=2)).generation == 2  # no-op


def test_another_member_cannot_edit_or_withdraw(member, team, cluster):
    d = request(member, team, cluster)
    other = MembershipFactory(team=team).user
    with pytest.raises(NotAllowed):
        actions.deployment_edit(actor=other, deployment=d, purpose="mine now")
    with pytest.raises(NotAllowed):
        actions.deployment_withdraw(actor=other, deployment=d)


def running(member, team, cluster):
    return DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="running")


def test_update_without_more_gpus_applies_directly(member, team, cluster, django_capture_on_commit_callbacks,
                                                   redis_client):
    d = running(member, team, cluster)
    with django_capture_on_commit_callbacks(execute=True):
        d = actions.deployment_update(actor=member, deployment=d,
                                      spec={**small(), "engine": {"max_model_len": 4096}}).deployment
    d.refresh_from_db()
    assert (d.status, d.generation, d.proposed_spec) == ("updating", 2, None)
    assert queued(redis_client, task=RECONCILE_TASK) == [[d.pk]]


def test_update_needing_more_gpus_goes_back_to_approval(member, team_admin, team, cluster):
    d = running(member, team, cluster)
    d = actions.deployment_update(actor=member, deployment=d, spec=small(nodes=2)).deployment
    d.refresh_from_db()
    assert d.status == "running" and d.proposed_spec["prefill"]["nodes"] == 2 and d.generation == 1
    d = approve(team_admin, d)
    assert (d.status, d.generation, d.proposed_spec) == ("updating", 2, None)
    assert d.spec["prefill"]["nodes"] == 2


def test_asking_for_what_it_has_is_no_change_in_any_state_but_a_change_waits_for_a_settled_one(
        member, team_admin, team, cluster):
    d = approve(team_admin, request(member, team, cluster))  # approved: not updatable until it settles
    events = d.events.count()
    same = actions.deployment_update(actor=member, deployment=d, spec=small(), purpose=d.purpose).deployment
    assert (same.generation, same.status, same.events.count()) == (d.generation, "approved", events)
    with pytest.raises(Conflict):
        actions.deployment_update(actor=member, deployment=d, spec=small(nodes=2))



def test_an_update_says_what_it_did_each_changed_field_old_to_new(member, team, cluster):
    d = running(member, team, cluster)
    proposed = actions.deployment_update(actor=member, deployment=d, spec=small(nodes=2), purpose="evals")
    assert (proposed.outcome, proposed.waits_for_approval, proposed.deployment.proposed_spec["prefill"]["nodes"]) == (
        Outcome.PROPOSED, True, 2)
    assert proposed.changes == (FieldChange("prefill.nodes", 1, 2, True), FieldChange("decode.nodes", 1, 2, True),
                                FieldChange("purpose", "", "evals", False))
    again = actions.deployment_update(actor=member, deployment=d, spec=small(nodes=2), purpose="evals")
    assert (again.outcome, again.changes, again.waits_for_approval) == (Outcome.UNCHANGED, (), True)
    tuning = {**small(), "engine": {"max_model_len": 4096}}  # needs no approver: applied at once, in its place
    applied = actions.deployment_update(actor=member, deployment=d, spec=tuning)
    assert (applied.outcome, applied.deployment.status, applied.deployment.generation) == (
        Outcome.UPDATED, "updating", 2)
    assert applied.changes == (FieldChange("engine.max_model_len", 8192, 4096, False),)
    pending = request(member, team, cluster, name="pend")
    edited = actions.deployment_update(actor=member, deployment=pending, spec=tuning)
    assert (edited.outcome, edited.deployment.generation) == (Outcome.EDITED, 2)
    assert edited.changes == (FieldChange("engine.max_model_len", 8192, 4096, True),)  # all of a request waits

def test_rejecting_a_proposed_update_keeps_it_running(member, team_admin, team, cluster):
    d = actions.deployment_update(actor=member, deployment=running(member, team, cluster),
                                  spec=small(nodes=2)).deployment
    d = reject(team_admin, d, comment="not now")
    d.refresh_from_db()
    assert d.status == "running" and d.proposed_spec is None
    assert d.events.filter(kind="update_rejected", message="not now").exists()


def test_delete_and_retry(member, team, cluster):
    failed = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="failed")
    assert actions.deployment_retry(actor=member, deployment=failed).status == "approved"
    assert actions.deployment_delete(actor=member, deployment=failed).status == "deleting"
    pending = request(member, team, cluster, name="pend")
    assert actions.deployment_delete(actor=member, deployment=pending).status == "withdrawn"
    with pytest.raises(Conflict):
        actions.deployment_retry(actor=member, deployment=pending)


def test_a_failed_deletion_is_retried_as_a_deletion_never_back_to_provisioning(member, team, cluster):
    """A paused deployment holds no quota: once its deletion failed, a retry must not bring it back to running (over
    a quota someone else may have taken meanwhile), nor may an update or a pause start it up again."""
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="paused")
    d = actions.deployment_delete(actor=member, deployment=d)
    actions.deployment_transition(deployment=d, to="failed", reason="teardown failed")  # the reconciler's word
    d = actions.deployment_retry(actor=member, deployment=d)
    assert d.status == "deleting"
    assert d.events.get(kind="retried").after == {"status": "deleting", "reason": "Retry of the deletion requested."}
    actions.deployment_transition(deployment=d, to="failed", reason="teardown failed again")
    spec = d.spec
    with pytest.raises(Conflict, match="its deletion was requested, so it can only be deleted"):
        actions.deployment_update(actor=member, deployment=d, spec={**small(), "engine": {"max_model_len": 4096}})
    with pytest.raises(Conflict, match="its deletion was requested, so it can only be deleted"):
        deployment_pause(actor=member, deployment=d)
    d.refresh_from_db()
    assert (d.status, d.spec) == ("failed", spec)
    assert actions.deployment_delete(actor=member, deployment=d).status == "deleting"


def test_deletions_that_failed_before_the_upgrade_are_retried_as_deletions_too(member, team, cluster):
    """The migration marks what the status alone said before: a deletion under way, and a failure that came
    straight from deleting; a deployment that failed while provisioning is still retried as before."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("deployments.migrations.0013_deployment_delete_requested_at")
    failed_deleting = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="running", name="a")
    actions.deployment_delete(actor=member, deployment=failed_deleting)
    actions.deployment_transition(deployment=failed_deleting, to="failed", reason="teardown failed")
    deleting = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="running", name="b")
    actions.deployment_delete(actor=member, deployment=deleting)
    failed_starting = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="provisioning",
                                        name="c")
    actions.deployment_transition(deployment=failed_starting, to="failed", reason="no capacity")
    Deployment.objects.update(delete_requested_at=None)  # as the rows were before the column
    migration.mark_deletions(apps, None)
    assert actions.deployment_retry(actor=member, deployment=failed_deleting).status == "deleting"
    deleting.refresh_from_db()
    assert deleting.delete_requested_at == deleting.status_changed_at
    assert actions.deployment_retry(actor=member, deployment=failed_starting).status == "approved"


def test_a_free_update_does_not_discard_someone_else_s_proposal_but_its_proposer_may_replace_it(
        member, team_admin, team, cluster):
    d = actions.deployment_update(actor=member, deployment=running(member, team, cluster),
                                  spec=small(nodes=2)).deployment
    proposed, generation = d.proposed_spec, d.generation
    tuning = {**small(), "engine": {"max_model_len": 4096}}  # applied at once: needs no approver
    with pytest.raises(Conflict, match=f"{member.username}'s proposed update of this deployment waits for approval"):
        actions.deployment_update(actor=team_admin, deployment=d, spec=tuning)
    d.refresh_from_db()
    assert (d.proposed_spec, d.proposed_by, d.generation, d.status) == (proposed, member, generation, "running")
    assert not d.events.filter(kind="updated").exists()
    d = actions.deployment_update(actor=member, deployment=d, spec=tuning).deployment  # theirs: they may replace it
    d.refresh_from_db()
    assert (d.proposed_spec, d.spec["engine"]["max_model_len"], d.status) == (None, 4096, "updating")
    assert "Replaces the update that was waiting for approval." in d.events.get(kind="updated").message


def test_a_proposal_does_not_replace_someone_else_s_waiting_proposal_unseen(member, team_admin, team, cluster):
    """A second person's update that needs approval too would take the first one's place in the queue: refused
    while it waits, as a change applied at once is; the first proposer may replace their own."""
    pool = small()["prefill"]
    more_prefill = spec_input(prefill={**pool, "nodes": 2}, decode=pool)  # each needs an approver (more nodes)
    more_decode = spec_input(prefill=pool, decode={**pool, "nodes": 2})
    d = actions.deployment_update(actor=member, deployment=running(member, team, cluster),
                                  spec=more_prefill).deployment
    proposed = d.proposed_spec
    with pytest.raises(Conflict, match=f"{member.username}'s proposed update of this deployment waits for approval"):
        actions.deployment_update(actor=team_admin, deployment=d, spec=more_decode)
    d.refresh_from_db()
    assert (d.proposed_spec, d.proposed_by) == (proposed, member)
    assert d.events.filter(kind="update_requested").count() == 1
    d = actions.deployment_update(actor=member, deployment=d, spec=more_decode).deployment
    assert (d.proposed_spec["decode"]["nodes"], d.proposed_by) == (2, member)


def test_audit_events_are_immutable(member, team, cluster):
    e = request(member, team, cluster).events.get()
    e.message = "rewritten"
    with pytest.raises(ValueError):
        e.save()
    with pytest.raises(ValueError):
        e.delete()
