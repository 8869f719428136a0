"""The deployment spec as frozen data: parsed from user input, loaded from storage, checked against the catalog.

`spec_parse` reads the API's request shape into a DeploymentSpec; `spec_load` reads the stored JSON back (the dict
is only the storage and wire form); `spec_check` applies every rule to a typed spec, so a spec stored last week is
re-validated against today's runtimes and instance types as it is. Among the rules are Ray's own placement rules
(deployments.placement): the bundles Ray Serve LLM will ask for must fit a node of their pool. Every error names the
field and says what to do, so the API can return it as a field-level 400.
"""
import difflib
import re
import typing
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, is_dataclass

from deployments.catalog import INSTANCE_TYPES, KNOWN_BROKEN, RUNTIMES, Runtime, runtime_choices_text
from deployments.model_sources import SourceRoots, not_allowed_message
from deployments.placement import placement_problems

# The two pools of a PD deployment, in the order they are built and shown.
STAGES = ("prefill", "decode")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX = 63
NAME_MAX = 40  # leaves room for the suffixes KubeRay adds to a RayService name (63 in all)
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
LOCAL_PATH = re.compile(r"^/[^\x00\s]{0,1023}$")
DTYPES = ("auto", "bfloat16", "float16")
KV_CONNECTORS = ("NixlConnector",)
# How KV moves between the pools. "efa": over EFA wherever both pools' instance types have it (NIXL's LIBFABRIC
# backend), and a deployment whose KV does not (TCP speed, or the backend failed to load) does not open to users.
# "tcp": the spec accepts NIXL's default UCX backend over TCP even on EFA types (e.g. an image without libfabric).
KV_TRANSPORTS = ("efa", "tcp")
# The stored shape. Version 1 is `asdict` of the dataclasses below with no "version" key: every row written so
# far. A later shape writes "version": 2 and spec_load upgrades older rows, so no migration has to rewrite them.
SPEC_VERSION = 1


MAX_GPUS_PER_NODE = max(i.gpus for i in INSTANCE_TYPES.values())


def _field(doc: str, *, bounds: tuple | None = None, choices: tuple | None = None, length: tuple | None = None,
           request_default=MISSING, default_text: str = "", request_as: tuple | None = None,
           or_object: type | None = None, stored: str = "", **kwargs) -> Field:
    """A spec field with what the API's schema says of it (deployments.spec_schema): a line of help, its bounds
    (which the rules below check: `_bounds`), the fixed set it is one of, its default where the request has one
    the dataclass does not (`request_default`, or in words: `default_text`), and where the request shape differs
    from the stored one (`request_as`: the request's key and object it is read from; `or_object`: the object a
    request may give instead of the value; `stored`: the stored field a request object's field is)."""
    return field(metadata={"doc": doc, "bounds": bounds, "choices": choices, "length": length,
                           "request_default": request_default, "default_text": default_text,
                           "request_as": request_as, "or_object": or_object, "stored": stored}, **kwargs)


def _declared(cls, name: str):
    """What the declaration of a field of `cls` states of it (_field's metadata)."""
    return next(f.metadata for f in fields(cls) if f.name == name)


def _bounds(cls, name: str) -> tuple:
    """The (low, high) a field of `cls` must lie within."""
    return _declared(cls, name)["bounds"]


class SpecError(Exception):
    """A spec that cannot run; `errors` maps a dotted field path to messages a user can act on."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class PoolSpec:
    """One stage's pool of nodes and the replicas it serves."""

    instance_type: str = _field("The nodes' instance type (the catalog's; `cpu`: the local target).",
                                choices=tuple(INSTANCE_TYPES))
    nodes: int = _field("Nodes in the pool.", bounds=(1, 64), request_default=1)
    gpus_per_node: int = _field("GPUs of each node the pool uses, at most the instance type's.",
                                bounds=(0, MAX_GPUS_PER_NODE), default_text="all the instance type's GPUs")
    tensor_parallel_size: int = _field("GPUs each replica spans; it divides gpus_per_node (1 on the CPU runtime).",
                                       bounds=(1, 64), default_text="gpus_per_node")
    replicas_min: int = _field("Replicas Ray Serve keeps at least.", bounds=(1, 256), request_default=1)
    replicas_max: int = _field("Replicas Ray Serve scales up to; replicas_max × tensor_parallel_size GPUs must "
                               "fit in the pool.", bounds=(1, 256), default_text="replicas_min")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class EngineSpec:
    """vLLM's settings for both pools."""

    max_model_len: int = _field("Longest sequence (prompt and output) in tokens.", bounds=(16, 1_048_576),
                                default=8192)
    dtype: str = _field("Weights' and activations' type.", choices=DTYPES, default="bfloat16")
    gpu_memory_utilization: float = _field("Share of each GPU's memory vLLM takes.", bounds=(0.1, 0.98),
                                           default=0.9)
    kv_connector: str = _field("How vLLM hands KV from prefill to decode.", choices=KV_CONNECTORS,
                               default="NixlConnector")
    kv_transport: str = _field("What KV moves over: `efa` where both pools have it, `tcp` to accept TCP speed.",
                               choices=KV_TRANSPORTS, default="efa")  # not written when it is the default


@dataclass(frozen=True)
class LoadSpec:
    """The load the deployment is planned and approved for."""

    requests_per_second: float = _field("Expected requests per second.", bounds=(0, 100_000), default=1.0)
    mean_prompt_tokens: int = _field("Mean prompt length in tokens, at most engine.max_model_len.",
                                     bounds=(1, 1_048_576), default=1024)
    mean_output_tokens: int = _field("Mean output length in tokens.", bounds=(1, 1_048_576), default=256)


@dataclass(frozen=True)
class PauseSpec:
    """When Tandem may pause and wake the deployment by itself; absent from the stored spec means off."""

    idle_minutes: int | None = _field("Pause after this many minutes without a request through the gateway "
                                      "(null: never).", bounds=(5, 30 * 24 * 60), default=None)
    wake_on_request: bool = _field("A request to the paused deployment starts a resume.", default=False)


IDLE_MINUTES_MIN, IDLE_MINUTES_MAX = _bounds(PauseSpec, "idle_minutes")


@dataclass(frozen=True)
class TargetsSpec:
    """Latency targets at the gateway. A target is met when at least `share` of the requests in a window meet
    it: TTFT at most `ttft_p95_ms`, mean inter-token latency at most `itl_p95_ms` (with share 0.95, exactly
    "p95 under the target"). None: no target for that measure."""

    ttft_p95_ms: float | None = _field("Time to first token, milliseconds (null: no target).", bounds=(1, 600_000),
                                       default=None)
    itl_p95_ms: float | None = _field("Mean inter-token latency, milliseconds (null: no target).",
                                      bounds=(1, 60_000), default=None)
    share: float = _field("Share of a window's requests that must meet each target.", bounds=(0.5, 1.0),
                          default=0.95)


ROLLOUT_STEPS_MAX = 10


@dataclass(frozen=True)
class RolloutSpec:
    """How an update that cannot roll in place (new weights, another runtime, another KV layout) moves traffic to
    the new generation: in steps (each the new generation's share of requests, in percent, rising to 100), with
    at most `max_surge` replicas per pool beyond the spec's while both run, each step judged against the old
    generation over `step_seconds` before the next."""

    steps: tuple[int, ...] = _field("The new generation's share of requests at each step, in percent: rising, "
                                    f"each 1-100, the last 100, at most {ROLLOUT_STEPS_MAX} steps.",
                                    bounds=(1, 100), length=(1, ROLLOUT_STEPS_MAX), default=(10, 50, 100))
    max_surge: int = _field("Replicas per pool beyond the spec's while both generations run.", bounds=(1, 16),
                            default=1)
    step_seconds: int = _field("Seconds each step is watched before the next (or before the old generation goes).",
                               bounds=(5, 3600), default=60)
    max_ttft_ratio: float = _field("Rolled back when the new generation's median time to first token exceeds the "
                                   "old's by more than this factor.", bounds=(1.0, 100.0), default=1.5)
    max_error_rate_increase: float = _field("Rolled back when the new generation's share of failed requests exceeds "
                                            "the old's by more than this.", bounds=(0.0, 1.0), default=0.01)
    max_attainment_drop: float = _field("Rolled back when the new generation's share of requests meeting the "
                                        "latency targets is lower than the old's by more than this.",
                                        bounds=(0.0, 1.0), default=0.05)


@dataclass(frozen=True)
class ModelRef:
    """The request's `model`, which DeploymentSpec stores as model_id and model_source."""

    id: str = _field("The name clients pass as `model`: 1-128 letters, digits, '.', '_', ':', '/' or '-'.",
                     length=(1, 128), stored="model_id")
    source: str = _field("Where the weights are: an s3://bucket/prefix URI, a Hugging Face repo id (org/name), or "
                         "an absolute path on the nodes (a `ray` cluster only).", length=(1, None),
                         stored="model_source")


@dataclass(frozen=True)
class RuntimePair:
    """A runtime named by its Ray and vLLM versions (and accelerator) instead of its key."""

    ray: str = _field("Ray's version.", stored="runtime")
    vllm: str = _field("vLLM's version.", stored="runtime")
    accelerator: str | None = _field("gpu or cpu (null: as the prefill pool's instance type).",
                                     choices=tuple(sorted({r.accelerator for r in RUNTIMES.values()})),
                                     default=None, stored="runtime")


@dataclass(frozen=True)
class DeploymentSpec:
    """What a deployment runs: the model, the runtime, the two pools and their settings."""

    model_id: str = _field("The model's name.", request_as=("model", ModelRef))
    model_source: str = _field("Where the weights are.", request_as=("model", ModelRef))
    runtime: str = _field("A runtime by its key, or by its Ray and vLLM versions as an object.",
                          choices=tuple(RUNTIMES), or_object=RuntimePair)
    prefill: PoolSpec = _field("The pool that reads prompts and hands their KV to decode.")
    decode: PoolSpec = _field("The pool that generates the output tokens.")
    engine: EngineSpec = _field("vLLM's settings (null or absent: the defaults).", default_factory=EngineSpec)
    expected_load: LoadSpec = _field("The expected load (null or absent: the defaults).", default_factory=LoadSpec)
    pause: PauseSpec = _field("When Tandem may pause and wake it (null or absent: never).",
                              default_factory=PauseSpec)
    # optional: absent from the stored form when None
    targets: TargetsSpec | None = _field("Latency targets at the gateway (null or absent: none).", default=None)
    rollout: RolloutSpec = _field("How an update that cannot roll in place is rolled out (null or absent: the "
                                  "defaults).", default_factory=RolloutSpec)

    @property
    def gpus(self) -> int:
        """GPUs the spec holds: nodes × GPUs per node over both pools (what quota counts)."""
        return self.prefill.gpus + self.decode.gpus

    def pool(self, stage: str) -> PoolSpec:
        """The prefill or decode pool by stage name."""
        return {"prefill": self.prefill, "decode": self.decode}[stage]

    def to_dict(self) -> dict:
        """The storage and wire form (version 1, see SPEC_VERSION); spec_load reads it back. An optional section
        left at its default (no pause settings, no targets) is not written, so specs stored before it existed
        compare equal to their reloads."""
        out = asdict(self)
        if self.pause == PauseSpec():
            del out["pause"]
        if self.targets is None:
            del out["targets"]
        if self.rollout == RolloutSpec():
            del out["rollout"]
        else:
            out["rollout"]["steps"] = list(self.rollout.steps)
        if self.engine.kv_transport == EngineSpec.kv_transport:
            del out["engine"]["kv_transport"]
        return out


def spec_load(stored) -> DeploymentSpec:
    """The typed spec from its stored JSON (`Deployment.spec`, `proposed_spec`). Loading trusts what was
    validated when it was stored; spec_check re-validates against today's catalog."""
    if not isinstance(stored, dict):
        raise SpecError({"spec": ["The stored spec is not an object."]})
    version = stored.get("version", 1)  # rows from before versioning carry no key: they are version 1
    if version != SPEC_VERSION:
        raise SpecError({"spec": [f"Stored spec version {version!r} is not one this Tandem reads "
                                  f"(it reads {SPEC_VERSION})."]})
    try:
        return DeploymentSpec(
            model_id=stored["model_id"], model_source=stored["model_source"], runtime=stored["runtime"],
            prefill=PoolSpec(**stored["prefill"]), decode=PoolSpec(**stored["decode"]),
            engine=EngineSpec(**stored.get("engine") or {}),
            expected_load=LoadSpec(**stored.get("expected_load") or {}),
            pause=PauseSpec(**stored.get("pause") or {}),
            targets=TargetsSpec(**stored["targets"]) if stored.get("targets") else None,
            rollout=_rollout_load(stored.get("rollout")),
        )
    except (KeyError, TypeError) as e:
        raise SpecError({"spec": [f"The stored spec is malformed ({type(e).__name__}: {e})."]}) from None


def _rollout_load(stored) -> RolloutSpec:
    if not stored:
        return RolloutSpec()
    return RolloutSpec(**{**stored, "steps": tuple(stored.get("steps", RolloutSpec.steps))})


def spec_facts(spec: DeploymentSpec) -> dict:
    """The facts other layers read from a deployment's approved spec, as `Deployment` columns (the gateway's SQL,
    quota, idle pause, search): stored beside the spec when it is written, so the spec's JSON is read only here."""
    return {
        "model_id": spec.model_id, "model_source": spec.model_source, "max_model_len": spec.engine.max_model_len,
        "wake_on_request": spec.pause.wake_on_request, "idle_minutes": spec.pause.idle_minutes,
        **{f"{stage}_{name}": getattr(spec.pool(stage), name)
           for stage in STAGES for name in ("instance_type", "nodes", "gpus_per_node")},
    }


def spec_request_shape(spec: DeploymentSpec) -> dict:
    """The request shape (what spec_parse reads) of a typed spec, for a change Tandem proposes through the same
    path as a person's."""
    data = spec.to_dict()
    data["model"] = {"id": data.pop("model_id"), "source": data.pop("model_source")}
    return data


def dns_label_errors(value, *, max_length: int = DNS1123_LABEL_MAX, why_short: str = "") -> list[str]:
    """Why `value` is not a DNS-1123 label of at most `max_length` characters (empty when it is).

    The one check for every name that ends up in a Kubernetes or AWS name: deployment names, team slugs,
    cluster names and the namespace and node group prefixes."""
    if not isinstance(value, str) or not value:
        return ["A name is required: lowercase letters, digits and '-'."]
    problems = []
    if len(value) > max_length:
        problems.append(f"At most {max_length} characters{why_short}; got {len(value)}.")
    if not DNS1123_LABEL.fullmatch(value):
        problems.append(
            "Use only lowercase letters, digits and '-', starting and ending with a letter or digit "
            f"(a DNS-1123 label); got {value!r}."
        )
    return problems


def name_errors(name) -> list[str]:
    """Why a deployment name is not a usable DNS-1123 label (empty when it is)."""
    return dns_label_errors(name, max_length=NAME_MAX, why_short=" (Kubernetes adds suffixes to it)")


class _Collector:
    """Errors by dotted path. Reading input only checks types; the rules (spec_check) check values."""

    def __init__(self):
        self.errors: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def whole(self, data: dict, key: str, path: str, default):
        value = data.get(key, default)
        if value is None:
            self.add(path, "This field is required.")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"Must be a whole number, got {value!r}.")
            return None
        return value

    def number(self, data: dict, key: str, path: str, default, *, what: str = "a number"):
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.add(path, f"Must be {what}, got {value!r}.")
            return None
        try:
            return float(value)
        except OverflowError:  # a JSON integer past any float: out of every range the rules allow
            self.add(path, f"Must be {what} of a usable size, got one of {len(str(value))} digits.")
            return None

    def within(self, path: str, value, lo, hi) -> bool:
        """False, without a message, for a value whose reading already failed."""
        if value is None:
            return False
        if not lo <= value <= hi:
            self.add(path, f"Must be between {lo} and {hi}, got {value}.")
            return False
        return True

    def one_of(self, path: str, value, choices) -> bool:
        if value not in choices:
            self.add(path, f"Must be one of {', '.join(map(str, choices))}; got {value!r}.")
            return False
        return True


# --- the request shape's keys -------------------------------------------------------------------------------
def request_fields(cls) -> dict[str, Field | type]:
    """The keys a request gives in a section of the spec (`cls`), in order: each with its field, or, where the
    request nests what is stored flat (`model`: model_id and model_source), with the dataclass it reads as."""
    found: dict[str, Field | type] = {}
    for f in fields(cls):
        key, nested = f.metadata.get("request_as") or (f.name, f)
        found[key] = nested
    return found


def request_section(cls, entry: Field | type) -> type | None:
    """The dataclass a request key of `cls` holds as an object (a section, `model`, the runtime pair), if any."""
    if isinstance(entry, type):
        return entry
    hint = typing.get_type_hints(cls)[entry.name]
    inner = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    if is_dataclass(inner):
        return inner
    return entry.metadata.get("or_object")


def _request_sections(cls=None, path: str = "") -> dict[str, type]:
    """Every object of the request shape by its dotted path ("" for the spec itself)."""
    cls = cls or DeploymentSpec
    found = {path: cls}
    for key, entry in request_fields(cls).items():
        if (inner := request_section(cls, entry)) is not None:
            found |= _request_sections(inner, f"{path}.{key}" if path else key)
    return found


def _unknown_message(key: str, path: str) -> str:
    """A key the object at `path` does not have: where it belongs when another object has it, else the key it is
    closest to, if any."""
    sections = _request_sections()
    homes = [f"spec.{p}" if p else "spec" for p, cls in sections.items() if p != path and key in request_fields(cls)]
    if homes:
        return f"unknown field; it belongs under {' or '.join(homes)}"
    close = difflib.get_close_matches(key, request_fields(sections[path]), n=1)
    return f"unknown field; did you mean {close[0]}?" if close else "unknown field"


def _unknown_keys(c: _Collector, data: dict, cls, path: str = "") -> None:
    """Refuse every key the request shape does not have, at every level: a typo must not be a silent no-op."""
    known = request_fields(cls)
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        if key not in known:
            c.add(where, _unknown_message(key, path))
        elif isinstance(value, dict) and (inner := request_section(cls, known[key])) is not None:
            _unknown_keys(c, value, inner, where)


# --- reading the request shape (types and defaults) ---------------------------------------------------------
def _unknown_runtime(c: _Collector, key) -> None:
    c.add("runtime", f"Unknown runtime {key!r}. Supported: {runtime_choices_text()}.")


def _runtime_read(c: _Collector, data, accelerator_hint: str | None) -> str | None:
    """The runtime key a request names: a key as given, or the supported runtime for a Ray and vLLM pair."""
    if isinstance(data, str):
        return data
    if not isinstance(data, dict):
        _unknown_runtime(c, data)
        return None
    ray, vllm = data.get("ray"), data.get("vllm")
    for name, version in (("ray", ray), ("vllm", vllm)):
        if not isinstance(version, str):
            c.add(f"runtime.{name}", "A version such as 2.60.0.")
    if not (isinstance(ray, str) and isinstance(vllm, str)):
        return None
    accelerator = data.get("accelerator")
    if accelerator is not None and not c.one_of("runtime.accelerator", accelerator,
                                                _declared(RuntimePair, "accelerator")["choices"]):
        return None
    accelerator = accelerator or accelerator_hint
    matches = [r for r in RUNTIMES.values() if r.ray == ray and r.vllm == vllm
               and (not accelerator or r.accelerator == accelerator)]
    if matches:
        return matches[0].key
    if (ray, vllm) in KNOWN_BROKEN:
        c.add("runtime", f"Ray {ray} with vLLM {vllm} is known not to work: {KNOWN_BROKEN[(ray, vllm)]} "
                         f"Supported: {runtime_choices_text()}.")
    else:
        c.add("runtime", f"Ray {ray} with vLLM {vllm} is not a supported combination. "
                         f"Supported: {runtime_choices_text()}.")
    return None


def _model_read(c: _Collector, data) -> tuple | None:
    if not isinstance(data, dict):
        c.add("model", "Give the model as an object: {\"id\": ..., \"source\": ...}.")
        return None
    return data.get("id"), data.get("source")


def _pool_read(c: _Collector, data, prefix: str) -> PoolSpec | None:
    if not isinstance(data, dict):
        c.add(prefix, "Give the pool as an object with instance_type, nodes, gpus_per_node, tensor_parallel_size.")
        return None
    itype = data.get("instance_type")
    instance = INSTANCE_TYPES.get(itype) if isinstance(itype, str) else None
    gpus = c.whole(data, "gpus_per_node", f"{prefix}.gpus_per_node", instance.gpus if instance else 0)
    rmin = c.whole(data, "replicas_min", f"{prefix}.replicas_min", _declared(PoolSpec, "replicas_min")["request_default"])
    return PoolSpec(
        instance_type=itype,
        nodes=c.whole(data, "nodes", f"{prefix}.nodes", _declared(PoolSpec, "nodes")["request_default"]),
        gpus_per_node=gpus,
        tensor_parallel_size=c.whole(data, "tensor_parallel_size", f"{prefix}.tensor_parallel_size",
                                     max(gpus or 1, 1)),
        replicas_min=rmin,
        replicas_max=c.whole(data, "replicas_max", f"{prefix}.replicas_max", rmin or 1),
    )


def _section(c: _Collector, data, path: str) -> dict:
    """A section's object; null or absent: its defaults."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        c.add(path, "Must be an object.")
        return {}
    return data


def _engine_read(c: _Collector, data) -> EngineSpec:
    data, d = _section(c, data, "engine"), EngineSpec()
    return EngineSpec(
        max_model_len=c.whole(data, "max_model_len", "engine.max_model_len", d.max_model_len),
        dtype=data.get("dtype", d.dtype),
        gpu_memory_utilization=c.number(data, "gpu_memory_utilization", "engine.gpu_memory_utilization",
                                        d.gpu_memory_utilization),
        kv_connector=data.get("kv_connector", d.kv_connector),
        kv_transport=data.get("kv_transport", d.kv_transport),
    )


def _load_read(c: _Collector, data) -> LoadSpec:
    data, d = _section(c, data, "expected_load"), LoadSpec()
    return LoadSpec(
        requests_per_second=c.number(data, "requests_per_second", "expected_load.requests_per_second",
                                     d.requests_per_second),
        mean_prompt_tokens=c.whole(data, "mean_prompt_tokens", "expected_load.mean_prompt_tokens",
                                   d.mean_prompt_tokens),
        mean_output_tokens=c.whole(data, "mean_output_tokens", "expected_load.mean_output_tokens",
                                   d.mean_output_tokens),
    )


def _pause_read(c: _Collector, data) -> PauseSpec:
    data = _section(c, data, "pause")
    idle = data.get("idle_minutes")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int)):
        c.add("pause.idle_minutes", f"Must be a whole number of minutes or null, got {idle!r}.")
        idle = None
    wake = data.get("wake_on_request", False)
    if not isinstance(wake, bool):
        c.add("pause.wake_on_request", f"Must be true or false, got {wake!r}.")
        wake = False
    return PauseSpec(idle_minutes=idle, wake_on_request=wake)


def _optional_ms(c: _Collector, data: dict, key: str):
    if data.get(key) is None:
        return None
    return c.number(data, key, f"targets.{key}", None, what="a number of milliseconds")


def _targets_read(c: _Collector, data) -> TargetsSpec | None:
    """None when the section is absent or names no target."""
    data, d = _section(c, data, "targets"), TargetsSpec()
    ttft, itl = _optional_ms(c, data, "ttft_p95_ms"), _optional_ms(c, data, "itl_p95_ms")
    share = c.number(data, "share", "targets.share", d.share)
    if ttft is None and itl is None:
        if data.get("share") is not None:
            c.add("targets", "Give ttft_p95_ms or itl_p95_ms (or both) with a share.")
        return None
    return TargetsSpec(ttft_p95_ms=ttft, itl_p95_ms=itl, share=share)


def _rollout_read(c: _Collector, data) -> RolloutSpec:
    data, d = _section(c, data, "rollout"), RolloutSpec()
    steps = data.get("steps", list(d.steps))
    if not isinstance(steps, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in steps):
        c.add("rollout.steps", f"Must be a list of whole percentages, got {steps!r}.")
        steps = list(d.steps)
    return RolloutSpec(
        steps=tuple(steps),
        max_surge=c.whole(data, "max_surge", "rollout.max_surge", d.max_surge),
        step_seconds=c.whole(data, "step_seconds", "rollout.step_seconds", d.step_seconds),
        max_ttft_ratio=c.number(data, "max_ttft_ratio", "rollout.max_ttft_ratio", d.max_ttft_ratio),
        max_error_rate_increase=c.number(data, "max_error_rate_increase", "rollout.max_error_rate_increase",
                                         d.max_error_rate_increase),
        max_attainment_drop=c.number(data, "max_attainment_drop", "rollout.max_attainment_drop",
                                     d.max_attainment_drop),
    )


# --- the rules, on typed values -----------------------------------------------------------------------------
def _runtime_rules(c: _Collector, key: str, target_kind: str | None) -> Runtime | None:
    """A supported runtime, not known broken (KNOWN_BROKEN is about vLLM's CUDA builds, so a CPU runtime is never
    refused by it), that runs on this kind of cluster."""
    runtime = RUNTIMES.get(key) if isinstance(key, str) else None
    if runtime is None:
        _unknown_runtime(c, key)
        return None
    broken = KNOWN_BROKEN.get((runtime.ray, runtime.vllm)) if runtime.accelerator == "gpu" else None
    if broken:
        c.add("runtime", f"Runtime {runtime.key} is known not to work: {broken} Supported: {runtime_choices_text()}.")
        return None
    if target_kind and target_kind not in runtime.target_kinds:
        c.add("runtime", f"Runtime {runtime.key} cannot run on a {target_kind} cluster "
                         f"(it runs on: {', '.join(runtime.target_kinds)}).")
        return None
    return runtime


def _model_rules(c: _Collector, model_id, source, target_kind: str | None, roots: SourceRoots | None) -> None:
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id):
        c.add("model.id", "The name clients pass as `model`: 1-128 letters, digits, '.', '_', ':', '/' or '-'.")
    if not isinstance(source, str) or not (S3_URI.fullmatch(source) or HF_REPO.fullmatch(source) or LOCAL_PATH.fullmatch(source)):
        c.add("model.source", "Give an s3://bucket/prefix URI, a Hugging Face repo id (org/name), or an "
                              "absolute path on the cluster's nodes.")
    elif LOCAL_PATH.fullmatch(source) and target_kind in ("eks", "kubernetes"):
        c.add("model.source", "A local path only works on a `ray` cluster; on Kubernetes use s3:// or a "
                              "Hugging Face repo id.")
    elif roots is not None and not roots.allows(source):
        c.add("model.source", not_allowed_message(roots))


def _pool_rules(c: _Collector, pool: PoolSpec, prefix: str, accelerator: str) -> bool:
    """The pool's own rules; True when it passes them all."""
    itype = pool.instance_type
    instance = INSTANCE_TYPES.get(itype) if isinstance(itype, str) else None
    if instance is None:
        known = ", ".join(sorted(INSTANCE_TYPES))
        c.add(f"{prefix}.instance_type", f"Unknown instance type {itype!r}; known types: {known}.")
        return False
    if accelerator == "cpu" and instance.gpus:
        c.add(f"{prefix}.instance_type", "The CPU runtime runs only on the 'cpu' instance type.")
        return False
    if accelerator == "gpu" and not instance.gpus:
        c.add(f"{prefix}.instance_type", f"{itype} has no GPU; pick a GPU instance type for this runtime.")
        return False
    max_gpus = instance.gpus
    nodes, gpus, tp = pool.nodes, pool.gpus_per_node, pool.tensor_parallel_size
    rmin, rmax = pool.replicas_min, pool.replicas_max
    in_range = [  # a list, not all(generator): every out-of-range field gets its message
        c.within(f"{prefix}.nodes", nodes, *_bounds(PoolSpec, "nodes")),
        c.within(f"{prefix}.gpus_per_node", gpus, 0 if not max_gpus else 1, max_gpus),
        c.within(f"{prefix}.tensor_parallel_size", tp, *_bounds(PoolSpec, "tensor_parallel_size")),
        c.within(f"{prefix}.replicas_min", rmin, *_bounds(PoolSpec, "replicas_min")),
        c.within(f"{prefix}.replicas_max", rmax, *_bounds(PoolSpec, "replicas_max")),
    ]
    if not all(in_range):
        return False
    ok = True
    if max_gpus and gpus % tp:
        c.add(f"{prefix}.tensor_parallel_size",
              f"Tensor-parallel size {tp} does not divide the {gpus} GPUs per node; use a divisor of {gpus}.")
        ok = False
    if not max_gpus and tp != 1:
        c.add(f"{prefix}.tensor_parallel_size", "Must be 1 on the CPU runtime.")
        ok = False
    if rmin > rmax:
        c.add(f"{prefix}.replicas_min", f"replicas_min ({rmin}) is above replicas_max ({rmax}).")
        ok = False
    if max_gpus and ok and rmax * tp > nodes * gpus:
        c.add(f"{prefix}.replicas_max",
              f"{rmax} replicas × {tp} GPUs each need {rmax * tp} GPUs, but the pool has "
              f"{nodes} node(s) × {gpus} GPUs = {nodes * gpus}.")
        ok = False
    return ok


def _engine_and_load_rules(c: _Collector, engine: EngineSpec, load: LoadSpec) -> None:
    max_len = c.within("engine.max_model_len", engine.max_model_len, *_bounds(EngineSpec, "max_model_len"))
    c.one_of("engine.dtype", engine.dtype, DTYPES)
    c.within("engine.gpu_memory_utilization", engine.gpu_memory_utilization,
             *_bounds(EngineSpec, "gpu_memory_utilization"))
    c.one_of("engine.kv_connector", engine.kv_connector, KV_CONNECTORS)
    c.one_of("engine.kv_transport", engine.kv_transport, KV_TRANSPORTS)
    c.within("expected_load.requests_per_second", load.requests_per_second,
             *_bounds(LoadSpec, "requests_per_second"))
    prompt = c.within("expected_load.mean_prompt_tokens", load.mean_prompt_tokens,
                      *_bounds(LoadSpec, "mean_prompt_tokens"))
    c.within("expected_load.mean_output_tokens", load.mean_output_tokens, *_bounds(LoadSpec, "mean_output_tokens"))
    if max_len and prompt and load.mean_prompt_tokens > engine.max_model_len:
        c.add("expected_load.mean_prompt_tokens",
              f"Longer than engine.max_model_len ({engine.max_model_len}); raise max_model_len or shorten prompts.")


def _pause_rules(c: _Collector, pause: PauseSpec) -> None:
    if pause.idle_minutes is not None:
        c.within("pause.idle_minutes", pause.idle_minutes, IDLE_MINUTES_MIN, IDLE_MINUTES_MAX)


def _targets_rules(c: _Collector, targets: TargetsSpec | None) -> None:
    if targets is None:
        return
    if targets.ttft_p95_ms is not None:
        c.within("targets.ttft_p95_ms", targets.ttft_p95_ms, *_bounds(TargetsSpec, "ttft_p95_ms"))
    if targets.itl_p95_ms is not None:
        c.within("targets.itl_p95_ms", targets.itl_p95_ms, *_bounds(TargetsSpec, "itl_p95_ms"))
    c.within("targets.share", targets.share, *_bounds(TargetsSpec, "share"))


def _rollout_rules(c: _Collector, rollout: RolloutSpec) -> None:
    steps, (fewest, most), (low, high) = rollout.steps, _declared(RolloutSpec, "steps")["length"], _bounds(
        RolloutSpec, "steps")
    if not fewest <= len(steps) <= most:
        c.add("rollout.steps", f"Give {fewest} to {most} steps, got {len(steps)}.")
    elif any(not low <= v <= high for v in steps) or list(steps) != sorted(set(steps)) or steps[-1] != high:
        c.add("rollout.steps", f"Must rise step by step, each {low}-{high}, and end at {high}; got {list(steps)}.")
    for name in ("max_surge", "step_seconds", "max_ttft_ratio", "max_error_rate_increase", "max_attainment_drop"):
        c.within(f"rollout.{name}", getattr(rollout, name), *_bounds(RolloutSpec, name))


def _rules(c: _Collector, *, runtime: str | None, model: tuple | None, prefill: PoolSpec | None,
           decode: PoolSpec | None, engine: EngineSpec, load: LoadSpec, target_kind: str | None,
           source_roots: SourceRoots | None, pause: PauseSpec = PauseSpec(),
           targets: TargetsSpec | None = None, rollout: RolloutSpec = RolloutSpec()) -> None:
    """Every rule, for the parts that could be read (None: its reading already reported why)."""
    found = _runtime_rules(c, runtime, target_kind) if runtime is not None else None
    if model is not None:
        _model_rules(c, *model, target_kind, source_roots)
    accelerator = found.accelerator if found else "gpu"
    for prefix, pool in (("prefill", prefill), ("decode", decode)):
        if pool is not None and _pool_rules(c, pool, prefix, accelerator):
            # Ray's own rules: the bundles Ray Serve LLM will ask for against what the pool's nodes advertise.
            for problem in placement_problems(stage=prefix, instance_type=pool.instance_type,
                                              gpus_per_node=pool.gpus_per_node,
                                              tensor_parallel_size=pool.tensor_parallel_size, target_kind=target_kind):
                c.add(prefix, problem)
    _engine_and_load_rules(c, engine, load)
    _pause_rules(c, pause)
    _targets_rules(c, targets)
    _rollout_rules(c, rollout)


def spec_check(spec: DeploymentSpec, *, target_kind: str | None = None,
               source_roots: SourceRoots | None = None) -> DeploymentSpec:
    """Check a typed spec against today's catalog and rules, or raise SpecError (a runtime found broken since it
    was stored, an instance type dropped, a cluster kind it cannot run on, a model source the cluster no longer
    allows the team: `source_roots`, deployments.model_sources). Returns the spec."""
    c = _Collector()
    _rules(c, runtime=spec.runtime, model=(spec.model_id, spec.model_source), prefill=spec.prefill,
           decode=spec.decode, engine=spec.engine, load=spec.expected_load, target_kind=target_kind,
           source_roots=source_roots, pause=spec.pause, targets=spec.targets,
           rollout=spec.rollout)
    if c.errors:
        raise SpecError(c.errors)
    return spec


def spec_parse_field(data, *, target_kind: str | None = None,
                     source_roots: SourceRoots | None = None) -> DeploymentSpec:
    """spec_parse of a request's `spec` field: each error's path starts at `spec.`, as the request names it."""
    try:
        return spec_parse(data, target_kind=target_kind, source_roots=source_roots)
    except SpecError as e:
        raise SpecError({k if k == "spec" else f"spec.{k}": v for k, v in e.errors.items()}) from None


def spec_parse(data, *, target_kind: str | None = None, source_roots: SourceRoots | None = None) -> DeploymentSpec:
    """Validate raw input (the API's `spec` object) into a DeploymentSpec, or raise SpecError. With a cluster, its
    kind and the model sources it allows the team (None: not checked here, e.g. a plan without a cluster)."""
    if not isinstance(data, dict):
        raise SpecError({"spec": ["Must be an object."]})
    c = _Collector()
    _unknown_keys(c, data, DeploymentSpec)
    prefill_in = data.get("prefill") if isinstance(data.get("prefill"), dict) else {}
    itype = prefill_in.get("instance_type")
    instance = INSTANCE_TYPES.get(itype) if isinstance(itype, str) else None
    hint = None if instance is None else ("gpu" if instance.gpus else "cpu")
    runtime = _runtime_read(c, data.get("runtime"), hint)
    model = _model_read(c, data.get("model"))
    prefill = _pool_read(c, data.get("prefill"), "prefill")
    decode = _pool_read(c, data.get("decode"), "decode")
    engine = _engine_read(c, data.get("engine"))
    load = _load_read(c, data.get("expected_load"))
    pause = _pause_read(c, data.get("pause"))
    targets = _targets_read(c, data.get("targets"))
    rollout = _rollout_read(c, data.get("rollout"))
    _rules(c, runtime=runtime, model=model, prefill=prefill, decode=decode, engine=engine, load=load,
           target_kind=target_kind, source_roots=source_roots, pause=pause, targets=targets, rollout=rollout)
    if c.errors:
        raise SpecError(c.errors)
    return DeploymentSpec(model[0], model[1], runtime, prefill, decode, engine, load, pause=pause, targets=targets,
                          rollout=rollout)
