#!/usr/bin/env bash
# `./tandem up`'s steps (tandem: cmd_up) on the bench's own database and Redis db, with a longer wait for the demo
# on a busy machine, then bench.pd_faults; everything it started stops on exit. Run it with no other PD stack or
# benchmark on the machine. Arguments after the output folder go to bench.pd_faults.
set -u
cd "$(dirname "$0")/.."
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/tandem_faults REDIS_URL=redis://127.0.0.1:6379/14
export DJANGO_SETTINGS_MODULE=controlplane.settings.local TANDEM_GATEWAY_BASE_URL=http://127.0.0.1:18801/v1
export TANDEM_RUNTIME_DIR=$HOME/.cache/tandem/pd-runtime
RT=$TANDEM_RUNTIME_DIR
OUT=${1:-var/pd-faults}
mkdir -p "$OUT" var
.venv/bin/python manage.py migrate --noinput >/dev/null
"$RT/venv/bin/python" local/ray_cluster.py start
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  "$RT/venv/bin/python" local/ray_cluster.py stop
}
trap cleanup EXIT
.venv/bin/gunicorn controlplane.wsgi -b 127.0.0.1:18800 -w 2 --preload --timeout 120 >var/web.log 2>&1 & pids+=($!)
.venv/bin/python -m gateway --host 127.0.0.1 --port 18801 >var/gateway.log 2>&1 & pids+=($!)
.venv/bin/celery -A controlplane worker -l INFO -c 2 >var/worker.log 2>&1 & pids+=($!)
.venv/bin/celery -A controlplane beat -l INFO -s var/celerybeat-schedule >var/beat.log 2>&1 & pids+=($!)
.venv/bin/python manage.py tandem_bootstrap --web-url http://127.0.0.1:18800 >"$OUT/bootstrap.log" 2>&1
.venv/bin/python manage.py tandem_demo --wait 2400 >"$OUT/demo.log" 2>&1 || { echo "demo failed"; cat "$OUT/demo.log"; exit 1; }
KEY=$(grep -o 'api_key="tdm_[^"]*"' "$OUT/demo.log" | head -1 | cut -d'"' -f2)
APP=$(.venv/bin/python - <<'PY'
import json, httpx, pathlib
s = json.loads(pathlib.Path.home().joinpath(".cache/tandem/pd-runtime/ray-cluster.json").read_text())
t = pathlib.Path(s["token_file"]).read_text().strip()
apps = httpx.get(s["dashboard_url"] + "/api/serve/applications/", headers={"Authorization": f"Bearer {t}"}).json()["applications"]
print(next(n for n in apps if n.startswith("tdm-")))
PY
)
echo "app $APP; bench starts $(date -u)"
.venv/bin/python -m bench.pd_faults --gateway http://127.0.0.1:18801/v1 --key "$KEY" --model tiny-llama \
  --state "$RT/ray-cluster.json" --app "$APP" --out "$OUT" "${@:2}"
echo "bench rc $? at $(date -u)"
