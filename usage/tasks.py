"""Celery tasks of the usage app."""
from celery import shared_task

from usage.drain import request_records_drain


@shared_task(acks_late=True, ignore_result=True)
def drain_request_records(max_batches: int = 100) -> int:
    """Move the request records the gateways have written to Redis so far into PostgreSQL (beat: every 5 s)."""
    return request_records_drain(max_batches=max_batches)
