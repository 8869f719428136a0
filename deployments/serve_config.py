"""The one serve config: a typed deployment spec → the Ray Serve config for `build_pd_openai_app`.

Pure functions only: the `ray` target PUTs the result to the dashboard, the `kubernetes` and `eks` targets wrap
it as a RayService's `serveConfigV2`. Prefill and decode are pinned to their own pool by a custom Ray resource
(`prefill_pool` / `decode_pool`) that each stage's placement bundle consumes and only that pool's nodes advertise;
each stage's accelerator type and bundles come from deployments.placement, which checks them against Ray's rules.
"""
from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.placement import stage_placement
from deployments.spec import STAGES, DeploymentSpec

IMPORT_PATH = "ray.serve.llm:build_pd_openai_app"
# On the CPU runtime each engine gets a core of its own (the local target has two).
CPU_OMP_CORE = {"prefill": "0", "decode": "1"}
CPU_MAX_NUM_SEQS = 8
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
NIXL_PORT_FIRST, NIXL_PORT_SLOTS, NIXL_PORTS_PER_STAGE = 20000, 200, 100


def _model_source(source: str):
    # Ray Serve LLM reads object storage through a mirror config; HF ids and local paths go as they are.
    if source.startswith("s3://"):
        return {"bucket_uri": source}
    return source


def _offline_env(source: str) -> dict:
    # A model on local disk must not trigger a Hub lookup (no network on such machines); one from the Hub must.
    if source.startswith("/"):
        return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return {}


def _kv_transfer(*, stage: str, cpu: bool, efa: bool, connector: str) -> dict:
    # vLLM deprecates kv_both for NixlConnector: prefill produces KV, decode consumes it (verified on the local
    # PD stack, local/README.md).
    kv = {"kv_connector": connector, "kv_role": KV_ROLE[stage]}
    if cpu:
        kv["kv_buffer_device"] = "cpu"
    if efa:
        # NIXL's default UCX backend silently runs at TCP speed on EFA (ai-dynamo/nixl#909).
        kv["kv_connector_extra_config"] = {"backends": ["LIBFABRIC"]}
    return kv


def kv_over_efa(spec: DeploymentSpec, stage: str) -> bool:
    """Whether the stage's KV moves over EFA: NIXL's LIBFABRIC backend, which loads libfabric from the image."""
    return INSTANCE_TYPES[spec.pool(stage).instance_type].has_efa and spec.engine.kv_transport == "efa"


def _stage_config(*, stage: str, spec: DeploymentSpec, cpu: bool, nixl_port: int | None,
                  replicas: int | None = None) -> dict:
    pool, engine = spec.pool(stage), spec.engine
    instance = INSTANCE_TYPES[pool.instance_type]
    # Fixed replicas while a side-by-side rollout holds the pool's size (workers.rollout); else the spec's bounds.
    autoscaling = {"min_replicas": pool.replicas_min, "max_replicas": pool.replicas_max} if replicas is None \
        else {"min_replicas": replicas, "max_replicas": replicas}
    kv = _kv_transfer(stage=stage, cpu=cpu, efa=kv_over_efa(spec, stage), connector=engine.kv_connector)
    config = {"model_loading_config": {"model_id": spec.model_id, "model_source": _model_source(spec.model_source)}}
    config.update(stage_placement(stage=stage, instance=instance, tensor_parallel_size=pool.tensor_parallel_size))
    if cpu:
        config.update({
            # num_cpus 0: the bundle already holds the core; the actor asking for one more never schedules.
            "deployment_config": {"autoscaling_config": autoscaling, "ray_actor_options": {"num_cpus": 0}},
            "engine_kwargs": {
                "dtype": engine.dtype, "enforce_eager": True, "max_model_len": engine.max_model_len,
                "max_num_seqs": CPU_MAX_NUM_SEQS, "max_num_batched_tokens": engine.max_model_len,
                "kv_transfer_config": kv,
            },
            "runtime_env": {"env_vars": {
                "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": CPU_OMP_CORE[stage],
                **_offline_env(spec.model_source),
            }},
        })
    else:
        tp = pool.tensor_parallel_size
        config.update({
            "deployment_config": {"autoscaling_config": autoscaling},
            "engine_kwargs": {
                "tensor_parallel_size": tp, "max_model_len": engine.max_model_len, "dtype": engine.dtype,
                "gpu_memory_utilization": engine.gpu_memory_utilization, "kv_transfer_config": kv,
            },
        })
    if nixl_port is not None:
        config["experimental_configs"] = {"NIXL_SIDE_CHANNEL_PORT_BASE": nixl_port}
    config["log_engine_metrics"] = True  # per-stage latency comes from these (observability issue)
    return config


def generation_suffix(app_generation: int) -> str:
    """What an application's name carries of its generation: nothing for a deployment's first application, `-g<N>`
    for one a side-by-side rollout brought up beside it (deployments.models.Rollout)."""
    return f"-g{app_generation}" if app_generation else ""


def ray_app_name(*, deployment_id: int, name: str, app_generation: int = 0) -> str:
    """The Serve application of a deployment on a shared Ray cluster: unique (the primary key) and readable (the
    deployment's name, which never changes). A name alone is unique only within a team."""
    return f"tdm-{deployment_id}-{name}{generation_suffix(app_generation)}"


def serve_app_name(*, deployment_id: int, name: str, target_kind: str, app_generation: int = 0) -> str:
    """The Serve application a deployment runs as (its metrics carry it as `application`): its id-based name on a
    shared `ray` cluster, its own name in a RayService (a Ray cluster of its own)."""
    if target_kind == "ray":
        return ray_app_name(deployment_id=deployment_id, name=name, app_generation=app_generation)
    return name + generation_suffix(app_generation)


def ray_route_prefix(*, deployment_id: int, app_generation: int = 0) -> str:
    """Where a deployment answers on a shared Ray cluster: Serve refuses two applications on one prefix."""
    return f"/d/{deployment_id}" + (f"/g{app_generation}" if app_generation else "")


def ray_nixl_ports(*, deployment_id: int, half: int = 0) -> dict[str, int]:
    """Each stage's NIXL side-channel port base on a shared Ray cluster.

    Ray Serve LLM binds every prefill replica to 20000 + its rank (decode: 22000 + rank), so a second deployment's
    engines on the same node would fail to bind. Each deployment gets its own block of 200 ports (100 per stage,
    room for replicas × tensor-parallel ranks) in 20000-59999, by id; ids equal modulo 200 share one, and Serve then
    reports the failed bind only if their replicas meet on a node. Two generations side by side split each stage's
    block: the serving one binds its `half` (50 ports), a rollout's new one the other (Deployment.app_port_half)."""
    base = NIXL_PORT_FIRST + (deployment_id % NIXL_PORT_SLOTS) * 2 * NIXL_PORTS_PER_STAGE
    base += half * (NIXL_PORTS_PER_STAGE // 2)
    return {"prefill": base, "decode": base + NIXL_PORTS_PER_STAGE}


def serve_config_build(*, app_name: str, spec: DeploymentSpec, target_kind: str, route_prefix: str = "/",
                       nixl_ports: dict[str, int] | None = None, http_options: dict | None = None,
                       replicas: dict[str, int] | None = None) -> dict:
    """The Ray Serve config (applications + cluster options) that runs `spec` as one PD application.

    A RayService holds one application on a Ray cluster of its own, so `/` and Ray's default NIXL ports are fine
    there; on a shared `ray` cluster each deployment gets its own name, prefix and NIXL ports (ray_app_name,
    ray_route_prefix, ray_nixl_ports)."""
    runtime = RUNTIMES[spec.runtime]
    cpu = runtime.accelerator == "cpu"
    args = {stage + "_config": _stage_config(stage=stage, spec=spec, cpu=cpu, nixl_port=(nixl_ports or {}).get(stage),
                                             replicas=(replicas or {}).get(stage)) for stage in STAGES}
    if cpu:
        # Without this the ingress asks for a CPU the two engines already hold and never schedules.
        args["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": 0}}
    app = {"name": app_name, "route_prefix": route_prefix, "import_path": IMPORT_PATH, "args": args}
    config = {"applications": [app]}
    if http_options is None and target_kind in ("kubernetes", "eks"):
        http_options = {"host": "0.0.0.0", "port": 8000}  # the pod's Serve port behind the Service
    if http_options:
        config["http_options"] = dict(http_options)
    config["proxy_location"] = "HeadOnly"  # the endpoint Service and the local target both reach the head
    return config
