"""`manage.py tandem_demo`: deploy the tiny model on the local cluster, wait for it, print a working snippet."""
import time

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from deployments.lifecycle import Status
from deployments.local_setup import (client_snippet, demo_deployment_start, demo_key_create, demo_ready,
                                     seen_serving_since)


class Command(BaseCommand):
    help = "Request, approve and wait for the demo PD deployment; print an API key and an openai snippet."

    def add_arguments(self, parser):
        parser.add_argument("--wait", type=int, default=600,
                            help="Seconds to wait for `running` and the conformance check.")

    def handle(self, *args, wait, **options):
        # `./tandem up` has just started the Ray cluster (empty) and the worker: only what a reconcile pass sees
        # from now on is about that cluster. A deployment stored as running from an earlier `up` is not enough.
        since = timezone.now()
        d = demo_deployment_start()
        self.stdout.write(f"Deployment {d.team.slug}/{d.name}: {d.status}; waiting up to {wait} s for it to run")
        deadline, last, status, told = time.monotonic() + wait, None, None, False
        while time.monotonic() < deadline:
            d.refresh_from_db()
            step = d.events.order_by("-created_at", "-id").values_list("kind", "message").first()
            if step != last:
                self.stdout.write(f"  {d.status:<13} {step[0]}: {step[1][:120]}" if step else f"  {d.status}")
                last = step
            if demo_ready(d, since=since):
                break  # seen serving on this cluster, and the conformance suite has checked it (users' keys work)
            if d.status == Status.RUNNING and not seen_serving_since(d, since) and not told:
                self.stdout.write("  It was running before this Ray cluster started; checking that it runs on it")
                told = True
            if status == Status.RUNNING and d.status == Status.PROVISIONING:
                self.stdout.write("  It is not on this Ray cluster: it is coming back (re-deploying; a few minutes "
                                  "on CPU)")
            if d.status == Status.FAILED:
                raise CommandError(f"The demo deployment failed: {d.status_reason}")
            status = d.status
            time.sleep(2)
        else:
            unseen = " (not yet seen serving on the Ray cluster just started)" if d.status == Status.RUNNING else ""
            raise CommandError(f"The demo deployment is still {d.status}{unseen} after {wait} s; see var/worker.log")
        key = demo_key_create()
        self.stdout.write("The deployment is running on this Ray cluster and checked. An API key, shown only now:\n")
        self.stdout.write(client_snippet(api_key=key, model=d.model_id))
