"""Rows the benchmark needs (team, member, keys, one running deployment per mock scenario) in its own database."""
import uuid


def bench_world(scenarios: dict[str, str], mock_port: int, *, cold_keys: int = 0) -> dict:
    """A team with one deployment per scenario and three kinds of key: a warm one without limits, one with
    (generous) rate limits, so each request pays the limiter's Redis round trip, and `cold_keys` keys that the
    gateway has never seen (each first use is a cache miss that reaches PostgreSQL)."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from deployments.models import Cluster, Deployment, Membership, Team
    from deployments.services.api_keys import api_key_create
    from deployments.services.spec_store import deployment_spec_set
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
            "engine": {"max_model_len": 8192}}, target_kind="kubernetes")
        d = Deployment(team=team, name=f"{name}-{tag}", cluster=cluster, requested_by=user, status="running",
                       endpoint_url=f"http://127.0.0.1:{mock_port}" + (f"/o/{options}" if options else ""))
        deployment_spec_set(deployment=d, spec=spec)
        d.save()
        models[name] = model
    _, raw = api_key_create(actor=user, team=team, name="bench")
    _, limited = api_key_create(actor=user, team=team, name="bench-limited", requests_per_minute=10_000_000,
                                tokens_per_minute=2_000_000_000)
    cold = [api_key_create(actor=user, team=team, name=f"bench-cold-{i}")[1] for i in range(cold_keys)]
    return {"raw_key": raw, "limited_key": limited, "cold_keys": cold, "models": models}
