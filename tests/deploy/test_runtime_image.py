"""deploy/runtime/Dockerfile, read with BuildKit's own parser (no Docker engine here): it builds the catalog's GPU
runtime (its base image and every version it pins are the runtime's), NIXL by the hashes the local runtime lock
pins, libfabric prepended to the base image's LD_LIBRARY_PATH, and a self-check that refuses an image without
libfabric (run here in the local PD runtime's venv, which has NIXL's LIBFABRIC plugin and no libfabric)."""
import os
import shlex
import subprocess
from pathlib import Path

import dockerfile
import pytest

from deployments.catalog import RUNTIMES
from tests.deploy.render import ROOT

RUNTIME_DIR = ROOT / "deploy" / "runtime"
# The catalog's field each build argument pins (RUNTIME_<FIELD>), and the runtime it builds (RUNTIME_KEY).
PINNED = ("ray", "vllm", "python", "cuda", "nixl", "efa_installer", "libfabric")


def _commands() -> list:
    return list(dockerfile.parse_file(str(RUNTIME_DIR / "Dockerfile")))


def _args() -> dict[str, str]:
    return dict(c.value[0].split("=", 1) for c in _commands() if c.cmd == "ARG" and "=" in c.value[0])


def _runtime():
    return RUNTIMES[_args()["RUNTIME_KEY"]]


def test_the_dockerfile_builds_the_catalogs_gpu_runtime_from_its_base_image():
    args, runtime = _args(), _runtime()
    assert runtime.accelerator == "gpu" and runtime.image_repository
    assert [c.value for c in _commands() if c.cmd == "FROM"] == [("${BASE_IMAGE}",)]
    assert args["BASE_IMAGE"] == runtime.base_image
    assert {f: args[f"RUNTIME_{f.upper()}"] for f in PINNED} == {f: getattr(runtime, f) for f in PINNED}


def test_libfabric_is_prepended_to_the_base_images_library_path_and_the_installer_installs_user_space_only():
    commands = _commands()
    assert [c.value for c in commands if c.cmd == "ENV"] == [("LD_LIBRARY_PATH",
                                                              "/opt/amazon/efa/lib:${LD_LIBRARY_PATH}")]
    scripts = [h.content for c in commands if c.cmd == "RUN" for h in c.heredocs]
    install = next(s for s in scripts if "efa_installer.sh" in s)
    words = shlex.split(install.replace("\\\n", " ").split("./efa_installer.sh", 1)[1].splitlines()[0])
    assert {"-y", "--skip-kmod", "--skip-limit-conf", "--no-verify", "--check-signatures"} <= set(words)
    assert 'gpgv --keyring "$work/efa-key.gpg"' in install  # the tarball, against the pinned key alone
    assert "selfcheck.py" in scripts[-1]  # the build's last step


def test_nixl_is_pinned_by_the_hashes_of_the_local_runtime_lock():
    runtime = _runtime()
    wheels = ("nixl", f"nixl-cu{runtime.cuda.split('.')[0]}")  # nixl loads the wheel of torch's CUDA major

    def entries(text: str) -> dict[str, str]:
        joined = text.replace("\\\n", " ")
        return {line.split("==")[0]: " ".join(line.split()) for line in joined.splitlines()
                if line.split("==")[0] in wheels}

    pinned = entries((RUNTIME_DIR / "nixl.txt").read_text())
    assert set(pinned) == set(wheels)
    assert pinned == entries((ROOT / "local" / "pd-runtime.lock").read_text())
    assert all(f"=={runtime.nixl} --hash=sha256:" in line for line in pinned.values())
    install = next(c for c in _commands() if c.cmd == "RUN" and "nixl.txt" in c.value[0])
    assert "--require-hashes" in install.value[0] and "--no-deps" in install.value[0]


def test_the_self_check_fails_an_image_without_libfabric_naming_what_the_libfabric_plugin_lacks():
    runtime_dir = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime")
    python = runtime_dir / "venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"The local PD runtime is missing ({python}): `./tandem test` installs it.")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
           **{k: v for k, v in _args().items() if k.startswith("RUNTIME_")}}
    done = subprocess.run([str(python), str(RUNTIME_DIR / "selfcheck.py")], capture_output=True, text=True,
                          env=env, timeout=120, cwd="/tmp")
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stderr.splitlines() if line.startswith("FAIL: ")]
    assert "FAIL: no libfabric.so.1 under /opt/amazon/efa/lib*" in failures
    assert any("libplugin_LIBFABRIC.so needs" in f and "libfabric.so.1" in f and "libhwloc.so.15" in f
               for f in failures), failures
    assert "ray        2.60.0                   wanted 2.60.0" in done.stdout  # what the venv does hold
