"""What a user reads when Serve fails: the cause from each failed deployment's traceback, from Serve's own answers
recorded on the local PD stack (local/examples/), the same whichever target reports them."""
import json

import pytest

from tests.support.serve_examples import EXAMPLES, deploy_failed, kuberay_deploy_failed
from workers.targets.serve_status import failure_cause, serve_app_message


def recorded(name: str) -> dict:
    [app] = json.loads((EXAMPLES / name).read_text())["applications"].values()
    return app


def test_a_bad_engine_setting_names_both_stages_and_vllms_reason_once():
    message = serve_app_message(recorded("applications-deploy-failed-engine.json"))
    assert message.startswith(
        "Decode:tiny-llama and Prefill:tiny-llama: RuntimeError: Failed to create vLLM engine config: 1 validation "
        "error for ModelConfig Value error, User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=2048.0"), message
    # pydantic's echo of the input and its documentation link are noise; Serve's summary line says nothing
    assert "[type=" not in message and "errors.pydantic.dev" not in message and "Failed to update" not in message
    assert message.count("RuntimeError") == 1 and "\x1b" not in message


def test_one_stage_failing_names_that_stage_only():
    message = serve_app_message(recorded("applications-deploy-failed.json"))
    assert message == ("Prefill:tiny-llama: RuntimeError: Failed to create vLLM engine config: Repo id must be in "
                       "the form 'repo_name' or 'namespace/repo_name': "
                       "'/root/.cache/tandem/pd-runtime/models/does-not-exist'. Use `repo_type` argument if needed.")


def test_a_config_serve_cannot_build_gives_the_validation_error_from_the_application_message():
    app = recorded("applications-deploy-failed-schema.json")
    assert app["deployments"] == {}
    assert serve_app_message(app).startswith(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VLLMEngineConfig "
        "placement_group_config Value error, Cannot specify both 'bundle_per_worker' and 'bundles'")


def test_kuberays_copy_of_the_status_reads_the_same_as_serves():
    assert serve_app_message(kuberay_deploy_failed(model_id="m")) == serve_app_message(deploy_failed(model_id="m"))
    assert serve_app_message(kuberay_deploy_failed(model_id="m")).startswith("Decode:m and Prefill:m: RuntimeError")


def test_a_running_application_has_no_message():
    assert serve_app_message(recorded("applications-running.json")) == ""


@pytest.mark.parametrize("message, expected", [
    ("Deployment 'Decode:m' in application 'a' has 1 replicas that have taken more than 30s to initialize.\n"
     "This may be caused by a slow __init__ or reconfigure method.",
     "Deployment 'Decode:m' in application 'a' has 1 replicas that have taken more than 30s to initialize.\n"
     "This may be caused by a slow __init__ or reconfigure method."),
    ("\x1b[36mray::X\x1b[39m Traceback (most recent call last):\n  File \"a.py\", line 1\n    raise ValueError('x')\n"
     "ValueError: x is wrong", "ValueError: x is wrong"),
    ("", ""),
])
def test_a_message_without_a_traceback_is_kept_plain_and_a_traceback_gives_its_exception(message, expected):
    assert failure_cause(message) == expected


def test_an_architecture_vllm_lacks_is_named_without_the_list_of_every_one_it_has():
    message = serve_app_message(recorded("applications-deploy-failed-architecture.json"))
    assert message == ("Prefill:tiny-llama: RuntimeError: Failed to create vLLM engine config: 1 validation error for "
                       "ModelConfig Value error, Model architectures ['TandemUnsupportedForCausalLM'] are not "
                       "supported for now. Supported architectures: dict_keys([…])"), message
