"""What Ray Serve says about an application, read the same way whichever target reports it: the Serve REST API
(`deployments`) on a Ray cluster, or KubeRay's copy of it (`serveDeploymentStatuses`) in a RayService's status.

When replicas fail to start, Serve's application message only names the deployments ("Failed to update the
deployments ['Prefill:m', 'Decode:m']."); the cause is at the end of each failed deployment's message, after a
colour-coded traceback (recorded from Ray 2.60 in local/examples/applications-deploy-failed*.json)."""
import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FAILED = ("DEPLOY_FAILED", "UNHEALTHY")
# An exception's own line at the end of a traceback: "RuntimeError: ...", "pydantic_core._pydantic_core.ValidationError:
# ...", "safetensors_rust.SafetensorError: ..." (unindented; a traceback's frames are indented).
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")
# pydantic's tail on every validation error: the input echoed back and a documentation link, noise to a user.
PYDANTIC_TAIL = re.compile(r"\s*\[type=[^\]]*\]|\s*For further information visit \S+")
# A list echoed whole (vLLM's "Supported architectures: dict_keys([...])" names every architecture it has).
LONG_LIST = re.compile(r"\[[^\[\]]{160,}\]")


def _lines(message: str) -> list[str]:
    return [line for line in ANSI.sub("", message or "").splitlines() if line.strip()]


def message_plain(message: str, *, limit: int = 600) -> str:
    """Serve's message without colours, its last lines only (where the cause is), at most `limit` characters."""
    return "\n".join(line.strip() for line in _lines(message)[-3:])[-limit:]


def failure_cause(message: str, *, limit: int = 600) -> str:
    """The exception a traceback ends in, with the lines that explain it, on one line; else the plain message."""
    lines = _lines(message)
    last = next((i for i in range(len(lines) - 1, -1, -1) if EXCEPTION_LINE.match(lines[i])), None)
    if last is None:
        return message_plain(message, limit=limit)
    cause = PYDANTIC_TAIL.sub("", " ".join(line.strip() for line in lines[last:]))
    return LONG_LIST.sub("[…]", cause)[:limit]


def serve_app_message(app: dict, *, limit: int = 900) -> str:
    """The application's message a user can act on: for a failed start, each failed deployment and its cause
    (deployments failing for the same cause share one line); otherwise Serve's own message, plain."""
    deployments = app.get("deployments") or app.get("serveDeploymentStatuses") or {}
    causes: dict[str, list[str]] = {}
    for name, status in deployments.items():
        if status.get("status") in FAILED and status.get("message"):
            causes.setdefault(failure_cause(status["message"]), []).append(name)
    if app.get("status") in FAILED and causes:
        return "; ".join(f"{' and '.join(names)}: {cause}" for cause, names in causes.items())[:limit]
    return failure_cause(app.get("message", ""), limit=limit)
