"""The local prefill/decode stack for end-to-end tests: the real Ray Serve LLM + vLLM (CPU) runtime.

`./tandem test` installs the runtime (cached) and builds the tiny model before pytest runs; these fixtures start
the local Ray cluster once for this package and always stop it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime")
MODEL = RUNTIME / "models" / "tiny-llama"


@pytest.fixture(scope="package")
def local_ray():
    """A running local Ray head shaped like the EKS cluster; its state (URLs, token file)."""
    if not (RUNTIME / "venv" / "bin" / "ray").exists() or not (MODEL / "config.json").exists():
        pytest.fail(f"The local PD runtime is not installed in {RUNTIME}: run `./tandem test`, which installs it "
                    "(local/install_runtime.sh) and builds the tiny model (local/build_tiny_model.py).")
    script = str(ROOT / "local" / "ray_cluster.py")
    subprocess.run([sys.executable, script, "start"], check=True, timeout=300)
    try:
        yield json.loads((RUNTIME / "ray-cluster.json").read_text())
    finally:
        subprocess.run([sys.executable, script, "stop"], timeout=300)
