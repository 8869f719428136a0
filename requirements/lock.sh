#!/usr/bin/env bash
# Regenerate the two locks from pyproject.toml, every file with its sha256 (pip-tools, from the dev lock).
#   prod.lock: what runs in production (the image installs only this).
#   dev.lock:  everything for development and the tests, constrained to prod.lock's versions.
# Extra arguments go to both runs, e.g. `bash requirements/lock.sh --upgrade-package django`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUSTOM_COMPILE_COMMAND="bash requirements/lock.sh"  # named in each lock's header
common=(--allow-unsafe --generate-hashes --no-emit-find-links --no-emit-index-url --strip-extras --quiet)
.venv/bin/pip-compile "${common[@]}" "$@" --output-file=requirements/prod.lock pyproject.toml
.venv/bin/pip-compile "${common[@]}" "$@" --extra=dev --constraint=requirements/prod.lock \
  --output-file=requirements/dev.lock pyproject.toml
