"""Beat sends tasks by name: a task that moved module (usage.tasks.drain_request_records, once gateway.tasks's)
and a schedule that still names its old home would send a message no worker runs, and usage would stop."""
from django.conf import settings

from controlplane.celery import app


def test_every_task_beat_sends_is_one_a_worker_registers():
    app.loader.import_default_modules()  # what a worker does at start: autodiscover every app's tasks
    unknown = {entry: spec["task"] for entry, spec in settings.CELERY_BEAT_SCHEDULE.items()
               if spec["task"] not in app.tasks}
    assert unknown == {}
