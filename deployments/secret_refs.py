"""Resolving a secret reference (`env:NAME` or `file:/path`) to its value, only where it is used.

A cluster's credential is sent as a bearer token to URLs its registration names, so a reference may name only
what an operator set aside for cluster credentials: an environment variable whose name has the declared prefix
(`TANDEM_CLUSTER_SECRET_ENV_PREFIX`, `TANDEM_CLUSTER_` by default) or a file under the one secrets directory
(`TANDEM_CLUSTER_SECRETS_DIR`, compared by resolved real path, so neither `..` nor a symlink leads out of it).
`env:DATABASE_URL` or `file:/proc/self/environ` would otherwise hand the control plane's own secrets to whoever
registered the URL. The rule is checked at registration (a 400) and again at every resolution.
"""
import os
import re
from pathlib import Path

from django.conf import settings

FORM = re.compile(r"^(env:[A-Z_][A-Z0-9_]{0,127}|file:/[^\x00]{1,1000})$")


class SecretRefError(Exception):
    """The reference is malformed, not allowed, or points at nothing; the message never contains a secret, nor
    where it lives (callers name the cluster: members and key holders read these messages)."""


def _secrets_dir() -> str:
    root = settings.TANDEM_CLUSTER_SECRETS_DIR
    return os.path.realpath(root) if root else ""


def secret_ref_errors(ref: str) -> list[str]:
    """Why `ref` may not name a cluster's credential (empty when it may, or when there is none)."""
    if not ref:
        return []
    if not isinstance(ref, str) or not FORM.fullmatch(ref):
        return ["Give `env:VARIABLE_NAME` or `file:/absolute/path`, not the secret itself."]
    scheme, _, where = ref.partition(":")
    if scheme == "env":
        prefix = settings.TANDEM_CLUSTER_SECRET_ENV_PREFIX
        if not where.startswith(prefix) or where == prefix:
            return [f"Only environment variables named {prefix}* can hold a cluster's credential; "
                    f"{where} is not one."]
        return []
    root = _secrets_dir()
    if not root:
        return ["File references are off here: set TANDEM_CLUSTER_SECRETS_DIR to the directory that holds "
                "cluster credentials, or use an environment variable."]
    real = os.path.realpath(where)
    if os.path.commonpath([real, root]) != root or real == root:
        return [f"A credential file must be inside {root} (after resolving links and '..'); {where} is not."]
    return []


def secret_resolve(ref: str) -> str:
    if not ref:
        return ""
    if secret_ref_errors(ref):
        # The same rule as at registration; named by setting, not by path (this can reach a status message).
        raise SecretRefError("The secret reference is not allowed: a cluster's credential must be an environment "
                             f"variable named {settings.TANDEM_CLUSTER_SECRET_ENV_PREFIX}* or a file inside "
                             "TANDEM_CLUSTER_SECRETS_DIR.")
    scheme, _, where = ref.partition(":")
    if scheme == "env":
        value = os.environ.get(where)
        if value is None:
            raise SecretRefError("The environment variable named by the cluster's secret reference is not set.")
        return value.strip()
    try:
        return Path(os.path.realpath(where)).read_text().strip()
    except OSError as e:
        raise SecretRefError(f"The file named by the cluster's secret reference cannot be read ({e.strerror})."
                             ) from None
