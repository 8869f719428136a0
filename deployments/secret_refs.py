"""Resolving a secret reference (`env:NAME` or `file:/path`) to its value, only where it is used."""
import os
from pathlib import Path


class SecretRefError(Exception):
    """The reference is malformed or points at nothing; the message never contains a secret, nor where it lives
    (callers name the cluster: members and key holders read these messages)."""


def secret_resolve(ref: str) -> str:
    if not ref:
        return ""
    scheme, _, where = ref.partition(":")
    if scheme == "env":
        value = os.environ.get(where)
        if value is None:
            raise SecretRefError("The environment variable named by the cluster's secret reference is not set.")
        return value.strip()
    if scheme == "file":
        try:
            return Path(where).read_text().strip()
        except OSError as e:
            raise SecretRefError(f"The file named by the cluster's secret reference cannot be read ({e.strerror})."
                                 ) from None
    raise SecretRefError("A secret reference is `env:NAME` or `file:/path`.")
