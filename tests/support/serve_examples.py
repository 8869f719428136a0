"""Ray Serve's own answers, recorded from Ray 2.60 on the local PD stack (`local/smoke.py --save-examples`, files
in local/examples/), for the stand-ins that play Serve or KubeRay: what they say is what Serve said."""
import json
from functools import cache
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "local" / "examples"


@cache
def _recorded(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def deploy_failed(*, model_id: str, example: str = "applications-deploy-failed-engine.json") -> dict:
    """A failed application's status as Serve's REST API reports it (status, message, deployments), its
    deployments named for `model_id` (`Prefill:<model_id>`, ...) instead of the recorded tiny-llama."""
    [app] = _recorded(example)["applications"].values()
    recorded_model = app["deployed_app_config"]["args"]["prefill_config"]["model_loading_config"]["model_id"]
    deployments = {name.replace(recorded_model, model_id): {k: d[k] for k in ("status", "status_trigger", "message")}
                   for name, d in app["deployments"].items()}
    return {"status": app["status"], "message": app["message"].replace(recorded_model, model_id),
            "deployments": deployments}


def kuberay_deploy_failed(*, model_id: str) -> dict:
    """The same failure as KubeRay copies it into a RayService's `activeServiceStatus.applicationStatuses`."""
    app = deploy_failed(model_id=model_id)
    return {"status": app["status"], "message": app["message"],
            "serveDeploymentStatuses": {name: {"status": d["status"], "message": d["message"]}
                                        for name, d in app["deployments"].items()}}
