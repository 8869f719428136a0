"""What waits on the Celery broker: the tasks a test's code enqueued, read back from the Redis queue a worker
started without `-Q` consumes."""
import base64
import json

from celery import current_app


def queued(client, *, task: str) -> list[list]:
    """The positional arguments of each message for `task` waiting on the default queue, oldest first."""
    found = []
    for raw in reversed(client.lrange(current_app.conf.task_default_queue, 0, -1)):  # LPUSHed: newest first
        message = json.loads(raw)
        if message["headers"]["task"] == task:
            body = message["body"]
            if message["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            found.append(json.loads(body)[0])
    return found
