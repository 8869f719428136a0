#!/usr/bin/env bash
# Regenerate the locks from pyproject.toml and local/pd-runtime.in, every file with its sha256 (pip-tools, from the
# dev lock). Each lock is complete: it pins every requirement (with its extras) of every package it holds, so it
# installs with `--require-hashes --no-deps` and pip never asks the index for anything else
# (tests/test_supply_chain.py checks it on the installed metadata).
#   prod.lock: what runs in production (the image installs only this): the `server` extra and the build backend.
#   dev.lock:  everything for development and the tests, constrained to prod.lock's versions.
#   local/pd-runtime.lock: the local PD runtime's venv (local/install_runtime.sh; its own Python world).
# Extra arguments go to every run, e.g. `bash requirements/lock.sh --upgrade-package django`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUSTOM_COMPILE_COMMAND="bash requirements/lock.sh"  # named in each lock's header
common=(--allow-unsafe --generate-hashes --no-emit-find-links --no-emit-index-url --strip-extras --quiet)
.venv/bin/pip-compile "${common[@]}" "$@" --extra=server --build-deps-for=wheel \
  --output-file=requirements/prod.lock pyproject.toml
.venv/bin/pip-compile "${common[@]}" "$@" --extra=server --extra=dev --build-deps-for=wheel \
  --constraint=requirements/prod.lock --output-file=requirements/dev.lock pyproject.toml
.venv/bin/python local/runtime_lock.py "$@"
