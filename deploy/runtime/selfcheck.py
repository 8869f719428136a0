"""The runtime image's build-time self-check: prints what the image holds and exits 1 unless it is exactly what the
build arguments (the catalog's runtime, deployments/catalog.py) say, with NIXL's LIBFABRIC backend able to load.

Run by deploy/runtime/Dockerfile with RUNTIME_RAY, RUNTIME_VLLM, RUNTIME_PYTHON, RUNTIME_CUDA, RUNTIME_NIXL and
RUNTIME_LIBFABRIC in the environment (its build arguments), and libcuda.so.1 reachable (CUDA's stub at build time:
the node's driver provides the real one). Standard library only: it must run in whatever Python the image has.
"""
import importlib.util
import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

EFA = Path("/opt/amazon/efa")  # where AWS's EFA installer puts libfabric, fi_info and their libraries
WANTED = ("ray", "vllm", "python", "cuda", "nixl", "libfabric")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _torch_cuda() -> str:
    try:
        import torch
    except ImportError:
        return "no torch"
    return torch.version.cuda or "a CPU build"


def _libfabric() -> tuple[str, Path | None]:
    """libfabric's version as fi_info reports it, and the directory holding libfabric.so.1 (lib on Ubuntu, lib64 on
    Amazon Linux and RHEL)."""
    found = sorted(EFA.glob("lib*/libfabric.so.1"))
    try:
        out = subprocess.run([str(EFA / "bin" / "fi_info"), "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return f"no fi_info ({type(e).__name__})", found[0].parent if found else None
    m = re.search(r"^libfabric: (\S+)", out, re.M)
    return (m.group(1) if m else f"unreadable ({out.strip()!r})"), found[0].parent if found else None


def _nixl_libfabric(cuda: str) -> list[str]:
    """Problems with NIXL's LIBFABRIC backend plugin: absent, a library it needs not found, or NIXL cannot load it."""
    module = f"nixl_cu{cuda.split('.')[0]}"
    site = Path(sysconfig.get_paths()["platlib"])
    plugins = sorted(p for p in site.glob("*/**/libplugin_LIBFABRIC.so") if module in p.parts[len(site.parts)])
    if not plugins:
        return [f"NIXL's LIBFABRIC plugin (libplugin_LIBFABRIC.so) is not in {module}'s files under {site}"]
    # NIXL's own libraries (libnixl_common.so, ...) are in the wheel and already loaded when NIXL loads a plugin;
    # what must come from the image is the rest: libfabric.so.1, libhwloc.so.15, libcuda.so.1, libcudart.
    shipped = {p.name for p in site.glob("*/**/*.so*") if module in p.parts[len(site.parts)]}
    missing = set()
    for plugin in plugins:
        ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout
        missing |= {line.split()[0] for line in ldd.splitlines() if "not found" in line} - shipped
    if missing:
        return [f"libplugin_LIBFABRIC.so needs {', '.join(sorted(missing))}, not found on the library path"]
    try:
        from nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent("tandem-image-selfcheck", nixl_agent_config(backends=[]))
        if "LIBFABRIC" not in agent.get_plugin_list():
            return [f"NIXL does not list a LIBFABRIC plugin: {agent.get_plugin_list()}"]
        agent.agent.getPluginParams("LIBFABRIC")  # loads the plugin; raises when it cannot
    except Exception as e:  # any failure of NIXL itself is the finding
        return [f"NIXL cannot load its LIBFABRIC plugin: {type(e).__name__}: {e}"]
    return []


def check() -> list[str]:
    """Print each version the image holds beside the wanted one; the problems found (empty: the image is right)."""
    want = {k: os.environ.get(f"RUNTIME_{k.upper()}", "") for k in WANTED}
    cuda = _torch_cuda()
    fabric, fabric_dir = _libfabric()
    got = {"ray": _version("ray"), "vllm": _version("vllm"), "python": "%d.%d" % sys.version_info[:2],
           "cuda": cuda, "nixl": _version("nixl"), "libfabric": fabric}
    wheel = f"nixl-cu{cuda.split('.')[0]}"  # the nixl meta package loads the wheel of torch's CUDA major
    got[wheel] = _version(wheel)
    want[wheel] = want["nixl"]
    for key, value in got.items():
        print(f"{key:10} {value:24} wanted {want[key]}")
    print(f"{'toolkit':10} CUDA {os.environ.get('CUDA_VERSION', '?')} (the base image's)")
    problems = [f"{k} is {got[k]}, not {want[k]}" for k in got if got[k] != want[k]]
    path = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    print(f"{'LD path':10} {':'.join(path)}")
    if fabric_dir is None:
        problems.append(f"no libfabric.so.1 under {EFA}/lib*")
    elif path[0] != str(fabric_dir):
        problems.append(f"LD_LIBRARY_PATH starts with {path[0]!r}, not libfabric's {fabric_dir}")
    if "/usr/local/nvidia/lib64" not in path:  # the base image's own entry: prepended to, never replaced
        problems.append("LD_LIBRARY_PATH lost the base image's /usr/local/nvidia/lib64")
    if importlib.util.find_spec("nixl") is None:
        problems.append("nixl is not importable")
    else:
        problems += _nixl_libfabric(cuda if cuda[0].isdigit() else want["cuda"])
    return problems


if __name__ == "__main__":
    found = check()
    for problem in found:
        print(f"FAIL: {problem}", file=sys.stderr)
    sys.exit(1 if found else 0)
