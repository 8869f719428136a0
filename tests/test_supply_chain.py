"""The supply chain: production installs one hashed lock with no test tools in it; development and the tests
install that lock plus their own; both say how they were made."""
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROD, DEV = ROOT / "requirements" / "prod.lock", ROOT / "requirements" / "dev.lock"
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


@pytest.mark.parametrize("lock", [PROD, DEV], ids=["prod", "dev"])
def test_every_requirement_is_pinned_with_sha256_hashes(lock):
    reqs = requirements(lock)
    assert len(reqs) > 50
    unhashed = [name for name, (_, hashes) in reqs.items() if not hashes]
    assert unhashed == []
    assert all(h.startswith("sha256:") and len(h) == 71 for _, hashes in reqs.values() for h in hashes)
    assert "bash requirements/lock.sh" in lock.read_text().split("\n", 6)[4]  # the header names the command


def test_production_lock_holds_no_test_tools_and_dev_lock_adds_them():
    prod, dev = requirements(PROD), requirements(DEV)
    assert set(prod) & TEST_TOOLS == set()
    assert TEST_TOOLS <= set(dev)
    # The tests run exactly what production runs.
    assert {n: dev[n][0] for n in prod} == {n: v for n, (v, _) in prod.items()}


def test_locks_cover_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert names(project["dependencies"]) <= set(requirements(PROD))
    assert names(project["optional-dependencies"]["dev"]) <= set(requirements(DEV))
    assert {"django-axes", "drf-spectacular-sidecar", "openai"} <= names(project["dependencies"])
    assert {"hypothesis", "pip-tools"} <= names(project["optional-dependencies"]["dev"])


def test_installs_check_hashes_and_the_image_gets_the_production_lock_only():
    from tests.deploy.test_image import lock_the_image_installs

    assert lock_the_image_installs() == "requirements/prod.lock"  # and with --require-hashes
    assert "dev.lock" not in (ROOT / "Dockerfile").read_text()
    tandem = (ROOT / "tandem").read_text()
    assert "pip install -q --require-hashes -r requirements/prod.lock -r requirements/dev.lock" in tandem
    assert not (ROOT / "requirements.lock").exists()


def test_the_readme_documents_the_locks_and_the_audit():
    readme = (ROOT / "README.md").read_text()
    assert "bash requirements/lock.sh" in readme and "pip-audit -r requirements/prod.lock" in readme
