"""Settings for a developer's machine and the embedded default of `./tandem up`."""
import os

os.environ.setdefault("DJANGO_SECRET_KEY", "local-only-not-secret")
os.environ.setdefault("DJANGO_DEBUG", "1")
# The local Ray cluster's token lives in the runtime directory (local/ray_cluster.py): `./tandem up` registers
# the `local` cluster with `file:<runtime>/ray-token`.
os.environ.setdefault("TANDEM_CLUSTER_SECRETS_DIR", os.environ.get("TANDEM_RUNTIME_DIR")
                      or os.path.expanduser("~/.cache/tandem/pd-runtime"))

from controlplane.settings.base import *  # noqa: E402,F403

# Report, don't enforce, on a developer's machine: Django's own debug pages use inline scripts and styles.
# Violations still show in the browser's console; the tests enforce the policy (settings.test).
SECURE_CSP_REPORT_ONLY, SECURE_CSP = SECURE_CSP, {}  # noqa: F405
