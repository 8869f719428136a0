"""Ray's own answers to the placement questions, from Ray's code: `main` runs under the runtime venv's python (Ray
2.60, Ray Serve LLM), which `ask_ray` starts for the suite (the suite's own environment has no Ray).

    <runtime>/venv/bin/python tests/support/ray_oracle.py REQUEST.json ANSWER.json

REQUEST: {"gpu_names": [NVML product names], "apps": [the `args` of a build_pd_openai_app application]}.
ANSWER: {"labels": {name: Ray's accelerator_type for it}, "apps": [{"prefill": STAGE, "decode": STAGE}]}, STAGE
being {"bundles", "strategy"} (VLLMEngineConfig.placement_bundles / placement_strategy) and
{"placement_group_bundles", "placement_group_strategy"} (what LLMServer.get_deployment_options hands Serve).
Each application is read the way build_pd_openai_app reads it (PDServingArgs), which starts no engine.
"""
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

RUNTIME = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime")
RUNTIME_PYTHON = RUNTIME / "venv" / "bin" / "python"


def runtime_python() -> str:
    """The runtime venv's python; a clear failure where it is missing (`./tandem test` installs it)."""
    if not RUNTIME_PYTHON.exists():
        raise AssertionError(f"The local PD runtime is not installed in {RUNTIME}: run `./tandem test`, which "
                             "installs it (local/install_runtime.sh).")
    return str(RUNTIME_PYTHON)


def ask_ray(request: dict, *, timeout: float = 600) -> dict:
    """Ray's answers to `request` (see above), from a runtime-venv python running `main`."""
    with tempfile.TemporaryDirectory() as tmp:
        asked, answered = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        asked.write_text(json.dumps(request))
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        done = subprocess.run([runtime_python(), __file__, str(asked), str(answered)], env=env, timeout=timeout,
                              capture_output=True, text=True)
        assert done.returncode == 0, f"Ray's code failed:\n{done.stderr[-4000:]}"
        return json.loads(answered.read_text())


def _stage(llm_config, server_cls) -> dict:
    engine = llm_config.get_engine_config()
    options = server_cls.get_deployment_options(llm_config)
    return {"bundles": engine.placement_bundles, "strategy": engine.placement_strategy,
            "placement_group_bundles": options["placement_group_bundles"],
            "placement_group_strategy": options["placement_group_strategy"]}


def main(request_path: str, answer_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    answer = {"labels": {name: NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(name)
                         for name in request.get("gpu_names", [])}, "apps": []}
    if request.get("apps"):
        import ray
        from ray.llm._internal.serve.core.server.llm_server import LLMServer
        from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

        # get_deployment_options copies the driver's runtime_env into the replica's; outside a driver that call
        # would start a Ray instance, and the placement options do not depend on it.
        ray.get_runtime_context = lambda: types.SimpleNamespace(runtime_env={})
        for args in request["apps"]:
            pd = PDServingArgs.model_validate(args)
            answer["apps"].append({"prefill": _stage(pd.prefill_config, LLMServer),
                                   "decode": _stage(pd.decode_config, LLMServer)})
    with open(answer_path, "w") as f:
        json.dump(answer, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
