"""The Dockerfile, read statically (no Docker engine here): multi-stage, production dependencies only and
hash-checked, non-root, and its build stage's collectstatic replayed on exactly the files it copies."""
import os
import re
import shlex
import shutil
import subprocess
import sys

from tests.deploy.render import ROOT, find, pod_spec, render


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            result.append([])
        result[-1].append((op.upper(), args.strip()))
    return result


def lock_the_image_installs() -> str:
    """The lock file the build stage's one `pip install` reads, with hashes required."""
    build = stages()[0]
    installs = [args for op, args in build if op == "RUN" and "pip install" in args and " -r " in args]
    assert len(installs) == 1, installs
    words = shlex.split(installs[0])
    assert "--require-hashes" in words and "--no-deps" in words
    inside = words[words.index("-r") + 1]
    return next(args.split()[0] for op, args in build if op == "COPY" and args.split()[-1] == inside)


def test_the_image_installs_production_dependencies_only_each_checked_by_hash():
    # What the production lock holds (hashes on every line, no test tools) is tests/test_supply_chain.py's.
    assert lock_the_image_installs() == "requirements/prod.lock"


def test_the_image_installs_the_project_itself_without_dependencies_for_tandemctl():
    """/venv/bin/tandemctl exists in the image: the project is installed with --no-deps from what the build stage
    copied, and nothing is fetched (--no-index); its build backend comes from the hashed lock."""
    build = stages()[0]
    (line,) = [args for op, args in build if op == "RUN" and "pip install" in args and " -r " not in args]
    words = shlex.split(line.split("&&")[0])
    assert {"--no-deps", "--no-build-isolation", "--no-index"} <= set(words) and words[-1] == "."
    copied = {args.split()[0] for op, args in build if op == "COPY"}
    assert {"pyproject.toml", "tandemctl"} <= copied
    from tests.test_supply_chain import requirements

    assert "setuptools" in requirements(ROOT / "requirements" / "prod.lock")


def test_the_final_stage_runs_as_the_non_root_user_the_manifests_expect():
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2
    assert not [a for op, a in final if op == "RUN" and ("pip " in a or "npm " in a)], "installs in the final stage"
    assert not [a for op, a in final if op == "COPY" and not a.startswith("--from=")], "the final stage copies sources"
    users = [a for op, a in final if op == "USER"]
    assert users, "the image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "USER must be numeric for runAsNonRoot"
    for overlay in ("eks", "kubernetes"):
        assert pod_spec(find(render(overlay), "Deployment", "tandem-web"))["securityContext"]["runAsUser"] == int(uid)
    assert any(op == "RUN" and "collectstatic" in a for op, a in build)
    assert any(op == "COPY" and a.startswith("--from=build") and a.split()[-1] == "/app" for op, a in final)


def test_the_build_stage_collects_the_vendored_front_end(tmp_path):
    """Replay the build stage: copy what it COPYs, run its collectstatic line; htmx and Chart.js are collected."""
    build = stages()[0]
    app = tmp_path / "app"
    app.mkdir()
    workdir_seen = False
    for op, args in build:
        if op == "WORKDIR" and args == "/app":
            workdir_seen = True
        if op == "COPY" and workdir_seen:
            *sources, dest = args.split()
            for src in sources:
                target = app / dest.removeprefix("./")
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target,
                                    ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
                else:
                    shutil.copy(ROOT / src, target if dest != "./" else app / src)
    line = next(a for op, a in build if op == "RUN" and "collectstatic" in a)
    command = line.split("&&", 1)[1].strip() if "&&" in line else line
    words = shlex.split(command)
    env = {k: v for k, _, v in (w.partition("=") for w in words if re.match(r"^[A-Z_]+=", w))}
    argv = [sys.executable] + [w for w in words if not re.match(r"^[A-Z_]+=", w)][1:]
    subprocess.run(argv, cwd=app, env={"PATH": os.environ["PATH"], **env}, check=True, capture_output=True)
    collected = app / "staticfiles"
    for path in ("vendor/htmx/htmx.min.js", "vendor/chartjs/chart.umd.min.js", "portal/portal.css",
                 "admin/css/base.css"):
        assert (collected / path).stat().st_size > 0, path
