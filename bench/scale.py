"""The control plane at scale: 10,000 deployments across 20 teams and 20 clusters, the Kubernetes emulator as target.

    psql -h 127.0.0.1 -U postgres -c 'create database tandem_scale_bench'   # once; the bench empties it each run
    flock -n /tmp/tandem-pd.lock true &&   # never beside another benchmark or the local PD stack
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tandem_scale_bench REDIS_URL=redis://127.0.0.1:6379/14 \\
        .venv/bin/python -m bench.scale --deployments 10000 [--samples 200]

What it measures (one table at the end):
- the REST API's list (a page of 50 at a random offset) and detail, as a team member (their team's ~500) and as a
  platform admin (all), through gunicorn (2 workers) with a personal access token: p50/p95 after a warm-up;
- the portal's deployments list (a random page) and approvals queue (team admin, platform admin), signed in;
- approvals/s through the API, and approval → RayService applied p50/p95 with 100 approved at once on one Celery
  worker with 2 prefork processes (from the `approved` to the first `applied` audit event), split into its parts:
  the approval request, the wait on the queue (until the first pass moved it to provisioning) and that pass until
  applied;
- beat's resync with every deployment running: the cost of one tick, what it enqueues, the ticks until every
  running deployment was looked at, and how long the 2 worker processes take to finish one batch of passes of
  running deployments (on deployments that really run in the emulator);
- database size per 1,000 deployments: their rows, 30 days of audit events (20 a day each) and per-minute rollups
  (every minute busy: an upper bound) kept for the rollup retention (and for 30 days), generated with SQL and
  measured as the growth of each table with its indexes.

The emulator runs as a process of its own (`python -m tests.support.k8s_emulator`), so its CPU is counted apart
from the bench's and the workers'.

Rows: teams, users and clusters through the ORM; the deployments with one `bulk_create` (a spec validated once
by `spec_parse`, then reused; statuses and `created_at` spread as a busy installation has them); events and
rollups with `INSERT ... SELECT generate_series`. Only the 100 approvals go through the services (over the API).
The database must be a dedicated one whose name ends in `bench` (it is emptied); REDIS_URL's db is flushed.
"""
import argparse
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")

from bench.apply_latency import percentile  # noqa: E402

PENDING_LEFT = 200  # requests left in the approvals queue besides the 100 approved
PROPOSED_EVERY = 60  # every 60th running deployment has an update waiting for approval
EVENTS_PER_DAY = 20
ROLLUP_SAMPLE = 5  # deployments whose rollups are generated (one busy day each), then scaled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deployments", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--clusters", type=int, default=20)
    parser.add_argument("--samples", type=int, default=200, help="timed requests per measure (after 20 warm-up)")
    parser.add_argument("--approvals", type=int, default=100)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection

    if not connection.settings_dict["NAME"].endswith("bench"):
        raise SystemExit("DATABASE_URL must name a dedicated database ending in 'bench': the bench empties it.")
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.stop()


class Bench:
    def __init__(self, args):
        self.args = args
        self.rows: list[tuple[str, str, str]] = []  # (measure, figure, target)
        self.procs: list[subprocess.Popen] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="tandem-scale-"))

    # --- the run ------------------------------------------------------------------------------------------
    def run(self) -> None:
        load = os.getloadavg()[0]
        self.emulator_url = self.start_emulator()
        t0 = time.monotonic()
        self.world = self.setup(self.emulator_url)
        self.add("setup: deployments created", f"{self.args.deployments:,} in {time.monotonic() - t0:.1f} s "
                 f"({self.args.teams} teams, {self.args.clusters} clusters)", "")
        self.web = self.start_web()
        self.measure_reads()
        self.start_worker()
        self.measure_approvals()
        self.measure_resync()
        _stop(self.emulator)
        self.measure_size()
        self.print_table(load)

    def add(self, measure: str, figure: str, target: str = "") -> None:
        self.rows.append((measure, figure, target))
        print(f"  {measure}: {figure}", flush=True)

    # --- rows ---------------------------------------------------------------------------------------------
    def setup(self, emulator_url: str) -> dict:
        import redis
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connection

        from deployments.lifecycle import Status
        from deployments.models import AccessToken, Cluster, Deployment, Membership, Team
        from deployments.services.credentials import credential_mint
        from deployments.services.spec_store import deployment_proposal_set, deployment_spec_set
        from deployments.spec import spec_parse
        from tests.factories import spec_input
        from tests.support.k8s_emulator import kubeconfig_text

        call_command("migrate", verbosity=0)
        call_command("flush", interactive=False, verbosity=0)
        redis.Redis.from_url(settings.REDIS_URL).flushdb()
        kubeconfig = Path(settings.TANDEM_CLUSTER_SECRETS_DIR) / f"tandem-scale-{os.getpid()}.kubeconfig"
        kubeconfig.write_text(kubeconfig_text(url=emulator_url, token="bench"))
        self.kubeconfig = kubeconfig

        User = get_user_model()
        root = User.objects.create(username="root", is_staff=True, is_superuser=True)
        teams, admins, members = [], [], []
        for i in range(self.args.teams):
            team = Team.objects.create(slug=f"team-{i:02d}", name=f"Team {i:02d}", gpu_quota=1_000_000)
            admin, member = User.objects.create(username=f"admin-{i:02d}"), User.objects.create(username=f"m-{i:02d}")
            Membership.objects.create(team=team, user=admin, role=Membership.Role.ADMIN)
            Membership.objects.create(team=team, user=member, role=Membership.Role.MEMBER)
            teams.append(team), admins.append(admin), members.append(member)
        clusters = [Cluster.objects.create(name=f"cluster-{i:02d}", kind="kubernetes", secret_ref=f"file:{kubeconfig}",
                                           config={"namespace_prefix": f"c{i:02d}-",
                                                   "model_sources": {"s3": ["s3://models"]}})
                    for i in range(self.args.clusters)]
        spec = spec_parse(spec_input(), target_kind="kubernetes")
        update = replace(spec, engine=replace(spec.engine, max_model_len=4096)).to_dict()
        n, approvals = self.args.deployments, self.args.approvals
        pending = approvals + PENDING_LEFT
        rows = []
        for i in range(n):
            t = i % len(teams)
            status = Status.PENDING_APPROVAL if i < pending else Status.RUNNING
            proposed = status == Status.RUNNING and i % PROPOSED_EVERY == 0
            d = Deployment(
                team=teams[t], cluster=clusters[(i // len(teams)) % len(clusters)], name=f"d{i:05d}",
                requested_by=members[t], status=status, generation=1,
                observed_generation=0 if status == Status.PENDING_APPROVAL else 1,
                endpoint_url="" if status == Status.PENDING_APPROVAL else f"http://d{i}.svc:8000")
            deployment_spec_set(deployment=d, spec=spec)  # the row as the services write it, facts included
            deployment_proposal_set(deployment=d, spec=update if proposed else None,
                                    by=members[t] if status == Status.PENDING_APPROVAL or proposed else None)
            rows.append(d)
        Deployment.objects.bulk_create(rows, batch_size=2000)
        with connection.cursor() as cursor:  # spread over 30 days, as a busy installation's rows are
            cursor.execute("UPDATE deployments_deployment SET created_at = now() - mod(id, 43200) * interval '1 minute'"
                           " WHERE status <> %s", [Status.PENDING_APPROVAL])
        with connection.cursor() as cursor:  # the mass update left dead rows; plans see the table as it is now
            cursor.execute("VACUUM ANALYZE")
        to_approve = list(Deployment.objects.filter(status=Status.PENDING_APPROVAL).order_by("pk")[:approvals])
        tokens = {}
        for who in (root, admins[0], members[0], *admins):
            tokens[who.username] = credential_mint(model=AccessToken, user=who, name="bench")[1]
        return {"root": root, "admins": admins, "members": members, "teams": teams, "tokens": tokens,
                "to_approve": to_approve}

    # --- processes ----------------------------------------------------------------------------------------
    def env_base(self) -> dict:
        return {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test", "PYTHONPATH": str(ROOT)}

    def env(self) -> dict:
        from django.db import connection

        db = connection.settings_dict
        return {**self.env_base(), "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}

    def start_emulator(self) -> str:
        """The Kubernetes emulator (with its stand-in KubeRay) in a process of its own; its URL."""
        log = open(self.workdir / "emulator.log", "ab")
        self.emulator = subprocess.Popen(
            [sys.executable, "-m", "tests.support.k8s_emulator", "--token", "bench", "--ready-after", "0.3"],
            cwd=ROOT, env=self.env_base(), stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True)
        self.procs.append(self.emulator)
        url = self.emulator.stdout.readline().strip()
        if not url.startswith("http://"):
            raise SystemExit(f"the Kubernetes emulator did not start; see {self.workdir / 'emulator.log'}")
        return url

    def rayservices(self) -> int:
        import httpx

        r = httpx.get(f"{self.emulator_url}/apis/ray.io/v1/rayservices", headers={"Authorization": "Bearer bench"},
                      timeout=60)
        r.raise_for_status()
        return len(r.json()["items"])

    def start_web(self) -> str:
        import httpx

        from tests.support.processes import free_port

        port = free_port()
        log = open(self.workdir / "web.log", "ab")
        self.web_proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "controlplane.wsgi:application", "-c", "gunicorn.conf.py",
             "-b", f"127.0.0.1:{port}", "-w", "2"], cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.procs.append(self.web_proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/healthz", timeout=1)
                return url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit(f"the web app did not start; see {self.workdir / 'web.log'}")

    def start_worker(self) -> None:
        log = open(self.workdir / "worker.log", "ab")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=prefork", "--concurrency=2",
             "-l", "WARNING", "--without-heartbeat", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(self.worker)
        time.sleep(5)  # connected before the clock starts

    def stop_worker(self) -> None:
        _stop(self.worker)

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc)
        if getattr(self, "kubeconfig", None):
            self.kubeconfig.unlink(missing_ok=True)

    # --- reads --------------------------------------------------------------------------------------------
    def timed(self, client, paths, *, headers=None) -> tuple[float, float, float]:
        """p50/p95 in ms of GETs of `paths()` (a fresh path each call), after 20 untimed, and the web app's CPU
        time per request in ms (what the figures cost where neighbours do not share the cores)."""
        times = []
        for i in range(20 + self.args.samples):
            if i == 20:
                cpu = _group_cpu_seconds(self.web_proc.pid)
            path = paths()
            start = time.perf_counter()
            r = client.get(self.web + path, headers=headers)
            elapsed = (time.perf_counter() - start) * 1000
            if r.status_code != 200:
                raise SystemExit(f"GET {path}: {r.status_code} {r.text[:300]}")
            if i >= 20:
                times.append(elapsed)
        cpu_ms = (_group_cpu_seconds(self.web_proc.pid) - cpu) / self.args.samples * 1000
        return percentile(times, 50), percentile(times, 95), cpu_ms

    def measure_reads(self) -> None:
        import httpx

        from deployments.models import Deployment

        w = self.world
        ids = list(Deployment.objects.values_list("pk", flat=True))
        team0 = list(Deployment.objects.filter(team=w["teams"][0]).values_list("pk", flat=True))
        n = len(ids)
        with httpx.Client(timeout=30) as client:
            for who, visible, label in ((w["members"][0].username, team0, "member"), ("root", ids, "platform admin")):
                auth = {"Authorization": f"Bearer {w['tokens'][who]}"}
                figures = self.timed(client, lambda v=visible: "/api/v1/deployments/?limit=50&offset="
                                     f"{random.randrange(0, max(len(v) - 50, 1))}", headers=auth)
                self.add(f"API list, page of 50 at a random offset, {label} ({len(visible):,} visible)",
                         _latency(*figures), "p95 ≤ 50 ms")
                figures = self.timed(client, lambda v=visible: f"/api/v1/deployments/{random.choice(v)}/",
                                     headers=auth)
                self.add(f"API detail, {label}", _latency(*figures), "p95 ≤ 50 ms")
            pages = math.ceil(len(team0) / 50)
            for who, path, label in ((w["members"][0], lambda: f"/deployments/?page={random.randint(1, pages)}",
                                      f"portal deployments list, random page of {pages}"),
                                     (w["admins"][0], lambda: "/approvals/", "portal approvals queue, team admin"),
                                     (w["root"], lambda: "/approvals/", "portal approvals queue, platform admin")):
                cookies = {"sessionid": _session_for(who)}
                client.cookies.clear()
                client.cookies.update(cookies)
                self.add(label, _latency(*self.timed(client, path)), "< 200 ms")
            client.cookies.clear()
        self.total = n

    # --- approvals ----------------------------------------------------------------------------------------
    def measure_approvals(self) -> None:
        import httpx

        from deployments.event_kinds import EventKind
        from deployments.models import Event

        w = self.world
        todo = w["to_approve"]
        admin_token = {a.pk: w["tokens"][a.username] for a in w["admins"]}
        team_admin = {t.pk: a.pk for t, a in zip(w["teams"], w["admins"])}
        cpu = _group_cpu_seconds(self.worker.pid)
        start = time.perf_counter()
        requests = []  # seconds each approval request took
        with httpx.Client(timeout=30) as client:
            for d in todo:
                sent = time.perf_counter()
                r = client.post(f"{self.web}/api/v1/deployments/{d.pk}/approve/", json={"generation": d.generation},
                                headers={"Authorization": f"Bearer {admin_token[team_admin[d.team_id]]}"})
                if r.status_code != 200:
                    raise SystemExit(f"approve {d.pk}: {r.status_code} {r.text[:300]}")
                requests.append(time.perf_counter() - sent)
        elapsed = time.perf_counter() - start
        self.add(f"approvals through the API ({len(todo)}, one after another)", f"{len(todo) / elapsed:.1f} /s")
        ids = [d.pk for d in todo]
        deadline = time.monotonic() + 300
        while Event.objects.filter(deployment_id__in=ids, kind=EventKind.APPLIED).values("deployment_id").distinct() \
                .count() < len(ids):
            if time.monotonic() > deadline:
                raise SystemExit(f"not every RayService applied in 300 s; see {self.workdir / 'worker.log'}")
            time.sleep(0.1)
        cpu = _group_cpu_seconds(self.worker.pid) - cpu
        latencies, waits, passes = [], [], []
        for d in todo:
            first = lambda kind: Event.objects.filter(deployment=d, kind=kind).order_by("id").first().created_at  # noqa: E731
            approved, started, applied = (first(EventKind.APPROVED), first(EventKind.STATUS_PROVISIONING),
                                          first(EventKind.APPLIED))
            latencies.append((applied - approved).total_seconds())
            waits.append((started - approved).total_seconds())
            passes.append((applied - started).total_seconds())
        self.add(f"approval → RayService applied, {len(todo)} at once, 2 prefork workers",
                 f"p50 {percentile(latencies, 50):.1f} s, p95 {percentile(latencies, 95):.1f} s, "
                 f"max {max(latencies):.1f} s (worker CPU {cpu / len(todo) * 1000:.0f} ms per approval until applied)",
                 "p95 ≤ 10 s")
        self.add("  its parts: approval request / queue wait until the first pass / that pass until applied",
                 f"p50 {percentile(requests, 50) * 1000:.0f} ms, p95 {percentile(requests, 95) * 1000:.0f} ms / "
                 f"p50 {percentile(waits, 50):.1f} s, p95 {percentile(waits, 95):.1f} s / "
                 f"p50 {percentile(passes, 50) * 1000:.0f} ms, p95 {percentile(passes, 95) * 1000:.0f} ms")

    # --- resync -------------------------------------------------------------------------------------------
    def measure_resync(self) -> None:
        from celery import current_app
        from django.conf import settings

        from controlplane.redis_client import redis_client
        from deployments.lifecycle import Status
        from deployments.models import Deployment
        from tests.support.broker import queued
        from workers.tasks import reconcile_deployment, resync_deployments

        really_running = list(Deployment.objects.filter(pk__in=[d.pk for d in self.world["to_approve"]])
                              .values_list("pk", flat=True))
        deadline = time.monotonic() + 120
        while Deployment.objects.filter(pk__in=really_running, status=Status.RUNNING).count() < len(really_running):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.stop_worker()
        queue = current_app.conf.task_default_queue
        redis = redis_client()
        redis.delete(queue)
        # Every deployment running (the queue's requests included) for this part: a tick must pick among 10,000.
        Deployment.objects.exclude(status=Status.RUNNING).update(status=Status.RUNNING)
        every = list(Deployment.objects.filter(status=Status.RUNNING).values_list("pk", flat=True))
        running = len(every)
        start = time.perf_counter()  # what one tick did before: a message for every running deployment
        for pk in every:
            reconcile_deployment.delay(pk)
        before = time.perf_counter() - start
        redis.delete(queue)
        batch = settings.TANDEM_RESYNC_BATCH
        ticks, seen, costs = math.ceil(running / batch), set(), []
        for _ in range(ticks):
            start = time.perf_counter()
            enqueued = resync_deployments()
            costs.append((time.perf_counter() - start) * 1000)
            seen |= {args[0] for args in queued(redis, task="workers.tasks.reconcile_deployment")}
            assert enqueued <= batch
            redis.delete(queue)  # as if the workers had finished them
        self.add(f"resync tick, {running:,} running (batch {batch})",
                 f"p50 {percentile(costs, 50):.0f} ms, max {max(costs):.0f} ms, enqueues {batch} "
                 f"(before: all {running:,}, {before:.1f} s a tick)", "")
        self.add("resync coverage", f"{len(seen):,} of {running:,} looked at in {ticks} ticks "
                 f"({ticks * 30 / 60:.0f} min at one tick per 30 s)")

        # How long the workers take for one batch of passes over running deployments that exist in the cluster.
        Deployment.objects.exclude(pk__in=really_running).update(status=Status.PAUSED)
        self.start_worker()
        order = [really_running[i % len(really_running)] for i in range(batch)]
        cpu, emulator_cpu = _group_cpu_seconds(self.worker.pid), _group_cpu_seconds(self.emulator.pid)
        start = time.perf_counter()
        for pk in order:
            reconcile_deployment.delay(pk)
        while redis.llen(queue) or redis.hlen("unacked"):
            time.sleep(0.05)
        took = time.perf_counter() - start
        per_pass = (_group_cpu_seconds(self.worker.pid) - cpu) / batch
        emulator_per_pass = (_group_cpu_seconds(self.emulator.pid) - emulator_cpu) / batch
        self.stop_worker()
        self.add(f"resync: one batch of {batch} passes of running deployments, 2 prefork workers",
                 f"finished in {took:.1f} s here ({batch / took * 30:.0f} per 30 s vs {batch} enqueued)", "≤ 30 s")
        self.add("resync: CPU per pass", f"worker {per_pass * 1000:.0f} ms, emulated API server "
                 f"{emulator_per_pass * 1000:.0f} ms; 2 workers with a core each: {2 * 30 / per_pass:.0f} passes "
                 "per 30 s")
        self.add("RayServices in the emulator", f"{self.rayservices()}")

    # --- size ---------------------------------------------------------------------------------------------
    def measure_size(self) -> None:
        from django.conf import settings
        from django.db import connection

        from deployments.event_kinds import EventKind
        from observability.rollups import GATEWAY_BOUNDS_MS, STAGE_VIEW
        from observability.snapshot import GAUGES

        n = self.total
        tables = ["deployments_deployment", "deployments_event", "observability_stagerollup",
                  "observability_valuerollup", "observability_throughputrollup"]

        def sizes() -> dict:
            with connection.cursor() as c:
                return {t: _size(c, t) for t in tables}

        with connection.cursor() as c:  # the bench's mass updates left dead rows: measure live ones
            c.execute("VACUUM FULL deployments_deployment")

        before = sizes()
        with connection.cursor() as c:
            c.execute("SELECT id, team_id FROM deployments_deployment ORDER BY id LIMIT 1000")
            sample = c.fetchall()
            ids = [r[0] for r in sample]
            # Declared kinds only (deployments.event_kinds): the API's schema lists them.
            kinds = [EventKind.APPLIED, EventKind.STATUS_RUNNING, EventKind.UPDATED, EventKind.CONFORMANCE_PASSED,
                     EventKind.BUDGET_WARNING, EventKind.RECOMMENDATION_AUTO_APPLIED]
            start = time.perf_counter()
            c.execute(f"""
                INSERT INTO deployments_event (team_id, deployment_id, actor_id, kind, message, before, after,
                                               duration_ms, created_at)
                SELECT d.team_id, d.id, NULL,
                       (%s::text[])[1 + mod(g, 6)],
                       'Serve application RUNNING on cluster-07: 2 of 2 deployments healthy (generation 3).',
                       '{{"replicas": 1, "max_model_len": 8192}}'::jsonb, '{{"replicas": 2, "max_model_len": 8192}}'::jsonb,
                       20 + mod(g, 500),
                       now() - g * interval '{1440 // EVENTS_PER_DAY} minutes'
                FROM deployments_deployment d, generate_series(1, {30 * EVENTS_PER_DAY}) g
                WHERE d.id = ANY(%s)""", [kinds, ids])
            events_s = time.perf_counter() - start
            engine_bounds = [1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 7500, 10000,
                             20000, 30000, 60000]
            stage_values = ", ".join(f"('{stage}', '{source}', '{pool}')" for _, source, stage, pool in STAGE_VIEW)
            rollup_ids = ids[:ROLLUP_SAMPLE]
            minutes = 1440
            start = time.perf_counter()
            c.execute(f"""
                INSERT INTO observability_stagerollup (deployment_id, minute, stage, source, pool, count, sum, bounds,
                                                       counts)
                SELECT d, date_trunc('minute', now()) - m * interval '1 minute', v.stage, v.source, v.pool, 40 + mod(m, 7),
                       1234.5 + m, CASE WHEN v.source = 'gateway' THEN %s::jsonb ELSE %s::jsonb END,
                       CASE WHEN v.source = 'gateway' THEN %s::jsonb ELSE %s::jsonb END
                FROM unnest(%s::int[]) d, generate_series(1, {minutes}) m, (VALUES {stage_values}) v(stage, source, pool)
                """, [_json(GATEWAY_BOUNDS_MS), _json(engine_bounds), _json(_counts(len(GATEWAY_BOUNDS_MS))),
                      _json(_counts(len(engine_bounds))), rollup_ids])
            value_names = ["prompt_tokens:local_compute", "prompt_tokens:external_kv_transfer", "generation_tokens",
                           "requests_finished", "nixl_failed_transfers", "nixl_failed_notifications",
                           "nixl_kv_expired"]
            peaks = [name for name, _ in GAUGES.values()]
            c.execute(f"""
                INSERT INTO observability_valuerollup (deployment_id, minute, name, pool, kind, value)
                SELECT d, date_trunc('minute', now()) - m * interval '1 minute', v.name, p.pool,
                       CASE WHEN v.name = ANY(%s) THEN 'peak' ELSE 'increase' END, m * 1.5
                FROM unnest(%s::int[]) d, generate_series(1, {minutes}) m, unnest(%s::text[]) v(name),
                     (VALUES ('prefill'), ('decode')) p(pool)""", [peaks, rollup_ids, value_names + peaks])
            c.execute(f"""
                INSERT INTO observability_throughputrollup (deployment_id, minute, requests, prompt_tokens,
                                                            completion_tokens)
                SELECT d, date_trunc('minute', now()) - m * interval '1 minute', 120, 120 * 1024, 120 * 256
                FROM unnest(%s::int[]) d, generate_series(1, {minutes}) m""", [rollup_ids])
            rollups_s = time.perf_counter() - start
            c.execute("ANALYZE")
        after = sizes()
        grow = {t: after[t] - before[t] for t in tables}
        per_k_deployments = before["deployments_deployment"] / n * 1000
        per_k_events = grow["deployments_event"]  # 1,000 deployments × 30 days
        rollup_day_per_deployment = sum(grow[t] for t in tables[2:]) / len(rollup_ids)
        keep = settings.TANDEM_ROLLUP_RETENTION_DAYS
        per_k_rollups = rollup_day_per_deployment * keep * 1000
        mb = 1024 ** 2
        self.add("DB per 1,000 deployments: deployment rows", f"{per_k_deployments / mb:.1f} MB")
        self.add(f"DB per 1,000 deployments: 30 days of events ({EVENTS_PER_DAY}/day each)",
                 f"{per_k_events / mb:.0f} MB ({per_k_events / (1000 * 30 * EVENTS_PER_DAY):.0f} B/event; "
                 f"generated in {events_s:.0f} s)")
        self.add(f"DB per 1,000 deployments: rollups, every minute busy, {keep} days kept",
                 f"{per_k_rollups / 1024 ** 3:.1f} GB ({rollup_day_per_deployment / mb:.1f} MB per deployment-day; "
                 f"30 days: {rollup_day_per_deployment * 30 * 1000 / 1024 ** 3:.1f} GB; sample generated in "
                 f"{rollups_s:.0f} s)")
        self.add("DB per 1,000 deployments, total (events 30 d, rollups kept)",
                 f"{(per_k_deployments + per_k_events + per_k_rollups) / 1024 ** 3:.1f} GB")

    def print_table(self, load: float) -> None:
        width = max(len(m) for m, _, _ in self.rows)
        fig = max(len(f) for _, f, _ in self.rows)
        print(f"\nControl plane at scale: {self.total:,} deployments (load average at start {load:.1f}, "
              f"{os.cpu_count()} cores)")
        print(f"| {'measure'.ljust(width)} | {'figure'.ljust(fig)} | target |")
        print(f"|{'-' * (width + 2)}|{'-' * (fig + 2)}|--------|")
        for m, f, t in self.rows:
            print(f"| {m.ljust(width)} | {f.ljust(fig)} | {t} |")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _session_for(user) -> str:
    """A signed-in portal session (as the sign-in page leaves it), its cookie value."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _latency(p50: float, p95: float, cpu_ms: float) -> str:
    return f"p50 {p50:.1f} ms, p95 {p95:.1f} ms (server CPU {cpu_ms:.1f} ms)"


def _group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes in a process group (a server and its workers)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _size(cursor, table: str) -> int:
    cursor.execute("SELECT pg_total_relation_size(%s)", [table])
    return cursor.fetchone()[0]


def _json(value) -> str:
    import json

    return json.dumps(value)


def _counts(bounds: int) -> list[int]:
    return [(i * 7) % 13 for i in range(bounds + 1)]


if __name__ == "__main__":
    main()
