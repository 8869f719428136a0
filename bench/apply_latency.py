"""Apply latency: approval → RayService applied, against the emulated Kubernetes API with a real Celery worker.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tandem_targets REDIS_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python bench/apply_latency.py [--runs 20] [--burst]

Measured from the `approved` audit event to the first `applied` event of each deployment (both written by
timezone.now() on this machine). Sequential by default (one approval at a time: the latency a user sees on an
idle control plane); `--burst` approves all at once (queueing behind one worker). The database is migrated and
the bench's rows removed afterwards; Redis db of REDIS_URL is flushed.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def main() -> None:
    """Run the benchmark and print p50/p95."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    redis.Redis.from_url(settings.REDIS_URL).flushdb()

    from deployments.event_kinds import EventKind
    from deployments.models import Cluster, Event, Membership
    from deployments.services.actions import deployment_approve, deployment_request
    from tests.factories import MembershipFactory, TeamFactory, spec_input
    from tests.support.k8s_emulator import EmulatorThread, KubeRayEmulator, kubeconfig_text
    from tests.workers.conftest import Worker

    stamp = str(int(time.time()))
    handler = KubeRayEmulator(token="bench", ready_after=0.3)
    handler.install_kuberay()
    workdir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    with EmulatorThread(handler) as emu:
        (workdir / "kubeconfig").write_text(kubeconfig_text(url=emu.url, token="bench"))
        team = TeamFactory(slug=f"bench-{stamp}", gpu_quota=8 * args.runs)
        member = MembershipFactory(team=team, role=Membership.Role.MEMBER, user__username=f"bench-m-{stamp}").user
        admin = MembershipFactory(team=team, role=Membership.Role.ADMIN, user__username=f"bench-a-{stamp}").user
        cluster = Cluster.objects.create(name=f"bench-{stamp}", kind="kubernetes",
                                         secret_ref=f"file:{workdir / 'kubeconfig'}",
                                         config={"model_sources": {"s3": ["s3://models"]}})
        db = connection.settings_dict
        env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
               "PYTHONPATH": str(ROOT), "TANDEM_WORKER_LOG": str(workdir / "worker.log"),
               "TANDEM_RECONCILE_REQUEUE_SECONDS": "0.5"}
        worker = Worker(env).start()
        try:
            time.sleep(3)  # let the worker connect before the clock starts
            requested = [deployment_request(actor=member, team=team, cluster=cluster, name=f"d{i}",
                                            spec=spec_input()) for i in range(args.runs)]
            for d in requested:
                deployment_approve(actor=admin, deployment=d, generation=d.generation)
                if not args.burst:
                    _wait_applied(Event, [d])
            _wait_applied(Event, requested)
            latencies = []
            for d in requested:
                approved = Event.objects.get(deployment=d, kind=EventKind.APPROVED).created_at
                applied = Event.objects.filter(deployment=d, kind=EventKind.APPLIED).order_by("id").first().created_at
                latencies.append((applied - approved).total_seconds() * 1000)
        finally:
            worker.stop()
        mode = "burst" if args.burst else "sequential"
        print(f"apply latency (approval → RayService applied), {args.runs} runs, {mode}, 1 worker (solo pool):")
        print(f"  p50 {percentile(latencies, 50):.0f} ms   p95 {percentile(latencies, 95):.0f} ms   "
              f"min {min(latencies):.0f} ms   max {max(latencies):.0f} ms   mean {statistics.mean(latencies):.0f} ms")
        print(f"  RayServices in the emulator: {len(handler.rayservices())}")
        if not os.environ.get("BENCH_KEEP"):
            _cleanup(team, cluster)


def _wait_applied(Event, deployments, timeout: float = 120.0) -> None:
    from deployments.event_kinds import EventKind

    deadline = time.monotonic() + timeout
    ids = [d.pk for d in deployments]
    while time.monotonic() < deadline:
        done = (Event.objects.filter(deployment_id__in=ids, kind=EventKind.APPLIED).values("deployment_id")
                .distinct().count())
        if done == len(ids):
            return
        time.sleep(0.02)
    raise SystemExit(f"timed out: only some of {len(ids)} deployments were applied")


def _cleanup(team, cluster) -> None:
    """Remove the bench's rows (audit events are immutable through the ORM, so delete them with SQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM deployments_event WHERE team_id = %s", [team.pk])
        cursor.execute("DELETE FROM deployments_deployment WHERE team_id = %s", [team.pk])
    users = [m.user for m in team.memberships.all()]
    team.delete()
    cluster.delete()
    for user in users:
        user.delete()


if __name__ == "__main__":
    main()
