"""Rows the benchmark needs (team, member, key, one running deployment per mock scenario) in its own database."""
import uuid


def bench_world(scenarios: dict[str, str], mock_port: int) -> dict:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from deployments.models import Cluster, Deployment, Membership, Team
    from deployments.services.api_keys import api_key_create
    from django.contrib.auth import get_user_model

    from deployments.spec import spec_parse

    tag = uuid.uuid4().hex[:6]
    team = Team.objects.create(slug=f"bench-{tag}", name="Bench")
    user = get_user_model().objects.create(username=f"bench-{tag}")
    Membership.objects.create(team=team, user=user)
    cluster = Cluster.objects.create(name=f"bench-{tag}", kind="kubernetes", config={"namespace_prefix": "b-"})
    models = {}
    for name, options in scenarios.items():
        model = f"bench-{name}-{tag}"
        spec = spec_parse({
            "model": {"id": model, "source": "s3://models/bench"}, "runtime": {"ray": "2.60.0", "vllm": "0.29.0"},
            "prefill": {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4},
            "decode": {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4},
            "engine": {"max_model_len": 8192}}, target_kind="kubernetes").to_dict()
        Deployment.objects.create(team=team, name=f"{name}-{tag}", cluster=cluster, requested_by=user, spec=spec,
                                  status="running", endpoint_url=f"http://127.0.0.1:{mock_port}" +
                                  (f"/o/{options}" if options else ""))
        models[name] = model
    _, raw = api_key_create(actor=user, team=team, name="bench")
    return {"raw_key": raw, "models": models}
