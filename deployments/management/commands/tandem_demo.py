"""`manage.py tandem_demo`: deploy the tiny model on the local cluster, wait for it, print a working snippet."""
import time

from django.core.management.base import BaseCommand, CommandError

from deployments.conditions import condition_true
from deployments.lifecycle import Status
from deployments.local_setup import client_snippet, demo_deployment_start, demo_key_create


class Command(BaseCommand):
    help = "Request, approve and wait for the demo PD deployment; print an API key and an openai snippet."

    def add_arguments(self, parser):
        parser.add_argument("--wait", type=int, default=600,
                            help="Seconds to wait for `running` and the conformance check.")

    def handle(self, *args, wait, **options):
        d = demo_deployment_start()
        self.stdout.write(f"Deployment {d.team.slug}/{d.name}: {d.status}; waiting up to {wait} s for it to run")
        deadline, last = time.monotonic() + wait, None
        while time.monotonic() < deadline:
            d.refresh_from_db()
            step = d.events.order_by("-created_at", "-id").values_list("kind", "message").first()
            if step != last:
                self.stdout.write(f"  {d.status:<13} {step[0]}: {step[1][:120]}" if step else f"  {d.status}")
                last = step
            if d.status == Status.RUNNING and condition_true(d.conditions, "EndpointReady"):
                break  # running, and the conformance suite has checked it (users' keys are let in from now)
            if d.status == Status.FAILED:
                raise CommandError(f"The demo deployment failed: {d.status_reason}")
            time.sleep(2)
        else:
            raise CommandError(f"The demo deployment is still {d.status} after {wait} s; see var/worker.log")
        key = demo_key_create()
        self.stdout.write("The deployment is running and checked. An API key, shown only now:\n")
        self.stdout.write(client_snippet(api_key=key, model=d.model_id))
