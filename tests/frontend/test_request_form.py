"""The request form: defaults per instance type, errors next to fields, htmx validation, plan and quota, edits."""
import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.models import Deployment
from deployments.services.actions import deployment_transition
from frontend import spec_form

pytestmark = pytest.mark.django_db
NEW = "/deployments/new/"
VALIDATE = "/deployments/validate/"


def form_data(cluster, **overrides) -> dict:
    data = spec_form.default_values() | {"name": "chat-8b", "cluster": cluster.name, "model_id": "llama-3-8b",
                                         "model_source": "s3://models/llama-3-8b", "purpose": "support bot"}
    data.update(overrides)
    return data


def test_urls_are_stable():
    assert reverse("frontend:deployment-new") == NEW and reverse("frontend:deployment-validate") == VALIDATE


def test_form_has_every_spec_field_with_defaults(signed_in, member, cluster):
    page = signed_in(member).get(NEW).content.decode()
    for f in spec_form.SPEC_FIELDS:
        assert f'name="{f.name}"' in page and f'for="id_{f.name}"' in page, f.name
    # g6e.12xlarge has 4 GPUs: GPUs per node and TP default to all of them.
    assert 'id="id_prefill_gpus_per_node" name="prefill_gpus_per_node" type="number" value="4"' in page
    assert 'id="id_decode_tensor_parallel_size" name="decode_tensor_parallel_size" type="number" value="4"' in page
    assert '"p5.48xlarge": 8' in page  # the instance → GPUs table for the form's script
    assert f'hx-post="{VALIDATE}"' in page and 'hx-trigger="input delay:500ms, change"' in page


def test_blank_gpus_and_tp_follow_the_instance_type():
    spec = spec_form.spec_from_form({"prefill_instance_type": "p5.48xlarge", "prefill_gpus_per_node": "",
                                     "decode_instance_type": "g6e.xlarge"})
    assert spec["prefill"] == {"instance_type": "p5.48xlarge", "gpus_per_node": 8, "tensor_parallel_size": 8}
    assert spec["decode"]["gpus_per_node"] == 1 and spec["decode"]["tensor_parallel_size"] == 1


def test_submit_creates_a_pending_request(signed_in, member, cluster, team):
    response = signed_in(member).post(NEW, form_data(cluster))
    d = Deployment.objects.get(name="chat-8b")
    assert response.status_code == 302 and response["Location"] == reverse("frontend:deployment-detail", args=[d.pk])
    assert d.status == Status.PENDING_APPROVAL and d.team == team and d.requested_by == member
    assert d.spec["prefill"]["tensor_parallel_size"] == 4 and d.purpose == "support bot"


def test_errors_are_shown_next_to_their_fields(signed_in, member, cluster):
    response = signed_in(member).post(NEW, form_data(cluster, name="Bad_Name", prefill_tensor_parallel_size="3",
                                                     model_source="ftp://nope", engine_max_model_len="lots"))
    page = response.content.decode()
    assert response.status_code == 400 and not Deployment.objects.exists()
    slot = lambda name: page.split(f'id="err-{name}">')[1].split("</div>")[0]  # noqa: E731
    assert "DNS-1123" in slot("name")
    assert "does not divide the 4 GPUs per node" in slot("prefill_tensor_parallel_size")
    assert "s3://bucket/prefix" in slot("model_source")
    assert "Must be a whole number, got &#x27;lots&#x27;" in slot("engine_max_model_len")
    assert 'id="id_prefill_tensor_parallel_size" name="prefill_tensor_parallel_size" type="number" value="3"' in page
    assert 'aria-invalid="true"' in page


def test_quota_refusal_is_shown_above_the_form(signed_in, member, cluster, team):
    team.gpu_quota = 4
    team.save()
    response = signed_in(member).post(NEW, form_data(cluster))
    page = response.content.decode()
    assert response.status_code == 400 and "cannot go ahead" in page and "4-GPU quota" in page
    assert "Needs 8 GPUs but only 4 of" in page  # the plan panel says so too


def test_duplicate_name_is_a_name_error(signed_in, member, cluster):
    client = signed_in(member)
    client.post(NEW, form_data(cluster))
    page = client.post(NEW, form_data(cluster)).content.decode()
    assert "already has a deployment named" in page.split('id="err-name">')[1].split("</div>")[0]


def test_validate_answers_plan_panel_and_out_of_band_errors(signed_in, member, cluster, htmx_headers):
    response = signed_in(member).post(VALIDATE, form_data(cluster, prefill_tensor_parallel_size="3", name=""),
                                      headers=htmx_headers("plan-panel", "prefill_tensor_parallel_size"))
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.strip().startswith('<div id="plan-panel"')
    tp_slot = body.split('id="err-prefill_tensor_parallel_size" hx-swap-oob="true">')[1].split("</div>")[0]
    assert "does not divide" in tp_slot
    # A field the user has not filled in yet is not scolded while typing; its slot is cleared.
    assert '<div class="field-error" id="err-name" hx-swap-oob="true"></div>' in body
    assert 'id="err-decode_nodes" hx-swap-oob="true"></div>' in body


def test_plan_panel_shows_gpus_against_quota_and_cost(signed_in, member, cluster, team, htmx_headers):
    body = signed_in(member).post(VALIDATE, form_data(cluster, prefill_nodes="2"),
                                  headers=htmx_headers("plan-panel")).content.decode()
    assert "12 <span" in body and "GPUs requested" in body and "quota 16" in body
    assert "$31.48" in body  # 3 × g6e.12xlarge at $10.493/h


LLAMA_8B_FACTS = {"fact_num_hidden_layers": "32", "fact_hidden_size": "4096", "fact_num_attention_heads": "32",
                  "fact_num_key_value_heads": "8", "fact_head_dim": "128", "fact_param_count": "8030261248"}


def test_plan_panel_shows_the_plan_with_its_arithmetic(signed_in, member, cluster, htmx_headers):
    body = signed_in(member).post(VALIDATE, form_data(cluster, **LLAMA_8B_FACTS),
                                  headers=htmx_headers("plan-panel")).content.decode()
    assert "KV bytes per token" in body and "128.00 KiB" in body
    assert ("<code>KV per token = 2 (K and V) × 32 layers × 8 KV heads × 128 head dim × 2 B (bfloat16) = "
            "131,072 B.</code>") in body


def test_plan_panel_shows_the_cost_at_the_chosen_cluster_s_own_prices(signed_in, member, cluster, htmx_headers):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 8.0}}  # the cluster's reserved price
    cluster.save()
    body = signed_in(member).post(VALIDATE, form_data(cluster, prefill_nodes="2", **LLAMA_8B_FACTS),
                                  headers=htmx_headers("plan-panel")).content.decode()
    assert "<dt>Hourly cost (at the cluster's prices, both pools)</dt><dd>$24.00</dd>" in body  # 3 nodes at $8
    assert ("<code>Cost: prefill 2 × g6e.12xlarge $8/h + decode 1 × g6e.12xlarge $8/h = $24.000/h.</code>"
            in body)


def test_without_model_facts_the_panel_says_what_to_enter(signed_in, member, cluster, htmx_headers):
    body = signed_in(member).post(VALIDATE, form_data(cluster), headers=htmx_headers()).content.decode()
    assert "Enter the model facts below" in body and "128.00 KiB" not in body


def test_edit_a_pending_request(signed_in, member, deployment):
    client = signed_in(member)
    url = reverse("frontend:deployment-edit", args=[deployment.pk])
    page = client.get(url).content.decode()
    assert 'value="llama-3-8b"' in page and "Edit request" in page and f'name="editing_id" value="{deployment.pk}"' in page
    data = form_data(deployment.cluster, decode_nodes="2")
    assert client.post(url, data).status_code == 302
    deployment.refresh_from_db()
    assert deployment.spec["decode"]["nodes"] == 2 and deployment.generation == 2


def test_update_needing_more_gpus_goes_back_to_approval(signed_in, member, team_admin, deployment):
    for to in (Status.APPROVED, Status.PROVISIONING, Status.RUNNING):
        deployment_transition(deployment=deployment, to=to, actor=team_admin)
    client = signed_in(member)
    response = client.post(reverse("frontend:deployment-edit", args=[deployment.pk]),
                           form_data(deployment.cluster, prefill_nodes="2"))
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.proposed_spec["prefill"]["nodes"] == 2 and deployment.status == Status.RUNNING
    page = client.get(reverse("frontend:deployment-detail", args=[deployment.pk])).content.decode()
    assert f"An update to 12 GPUs (now 8) proposed by {member.username} is waiting" in page


def test_validate_for_an_edit_uses_the_deployment(signed_in, member, deployment, htmx_headers):
    data = form_data(deployment.cluster, editing_id=str(deployment.pk))
    body = signed_in(member).post(VALIDATE, data, headers=htmx_headers()).content.decode()
    assert "8 <span" in body and "held 0" in body
