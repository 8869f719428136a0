"""Drain the gateway's Redis stream of request records into RequestRecord rows, in batches, exactly once."""
import datetime as dt
import logging
import os
import socket
import time

import orjson
import redis
from django.db import close_old_connections, transaction
from django.db.models import Q

from controlplane.record_stream import RECORD_STREAM
from controlplane.redis_client import redis_client
from deployments.models import ApiKey, Deployment
from usage.models import RequestRecord

log = logging.getLogger(__name__)

GROUP = "tandem-drain"
CLAIM_IDLE_MS = 60_000  # a drainer that held entries this long without acknowledging them is presumed dead


def _ensure_group(r) -> None:
    try:
        r.xgroup_create(RECORD_STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


def _rows(entries) -> list[RequestRecord]:
    parsed = []
    for _, fields in entries:  # `b`: a list of records (one entry per gateway flush); `r`: one record
        if not fields:  # a pending entry trimmed from the stream meanwhile: nothing left to read
            continue
        try:
            parsed.extend(orjson.loads(fields[b"b"]) if b"b" in fields else [orjson.loads(fields[b"r"])])
        except (KeyError, orjson.JSONDecodeError):
            log.warning("skipping a malformed request record")
    # Keys and deployments can be deleted between the request and the drain: keep the record, drop the link.
    keys = set(ApiKey.objects.filter(pk__in={p["api_key_id"] for p in parsed}).values_list("pk", flat=True))
    deps = set(Deployment.objects.filter(pk__in={p["deployment_id"] for p in parsed}).values_list("pk", flat=True))
    return [RequestRecord(
        request_id=p["request_id"], client_request_id=p.get("client_request_id", ""),
        created_at=dt.datetime.fromtimestamp(p["created_at"], dt.UTC),
        api_key_id=p["api_key_id"] if p["api_key_id"] in keys else None,
        deployment_id=p["deployment_id"] if p["deployment_id"] in deps else None,
        endpoint=p["endpoint"], stream=p["stream"], status_code=p["status_code"], error_type=p["error_type"][:60],
        prompt_tokens=p["prompt_tokens"], completion_tokens=p["completion_tokens"], partial=p["partial"],
        ttft_ms=p["ttft_ms"], e2e_ms=p["e2e_ms"], mean_itl_ms=p["mean_itl_ms"], max_itl_ms=p["max_itl_ms"],
        bytes_out=p["bytes_out"], generation=p.get("generation")) for p in parsed]


def _store(rows: list[RequestRecord]) -> None:
    last_used: dict[int, dt.datetime] = {}
    for row in rows:
        if row.api_key_id and row.created_at > last_used.get(row.api_key_id, row.created_at - dt.timedelta(1)):
            last_used[row.api_key_id] = row.created_at
    with transaction.atomic():
        # A redelivered entry (drainer died after insert, before ack) hits the unique request_id (the gateway's
        # own, one per request) and is skipped.
        RequestRecord.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
        for pk, when in last_used.items():
            ApiKey.objects.filter(pk=pk).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=when)) \
                .update(last_used_at=when)


def drain_batch(r, consumer: str, *, count: int = 50) -> int:
    """Move one batch of `count` entries, each up to RECORDS_PER_ENTRY records, into PostgreSQL: this drainer's
    own unacknowledged entries first (a pass that failed, e.g. while PostgreSQL restarted, is retried at once, not
    after CLAIM_IDLE_MS), then entries reclaimed from a dead drainer, then new ones. Returns how many it moved."""
    answer = r.xreadgroup(GROUP, consumer, {RECORD_STREAM: "0"}, count=count)
    entries = answer[0][1] if answer else []
    if not entries:
        _, entries, *_ = r.xautoclaim(RECORD_STREAM, GROUP, consumer, min_idle_time=CLAIM_IDLE_MS, count=count)
    if not entries:
        answer = r.xreadgroup(GROUP, consumer, {RECORD_STREAM: ">"}, count=count)
        entries = answer[0][1] if answer else []
    if not entries:
        return 0
    _store(_rows(entries))
    ids = [entry_id for entry_id, _ in entries]
    pipe = r.pipeline()
    pipe.xack(RECORD_STREAM, GROUP, *ids)
    pipe.xdel(RECORD_STREAM, *ids)
    pipe.execute()
    return len(entries)


def request_records_drain(*, max_batches: int = 100) -> int:
    """Drain what the gateways have written so far, at most `max_batches` batches (the Celery task
    usage.tasks.drain_request_records runs it every few seconds; drain_forever in a loop)."""
    r = redis_client()
    _ensure_group(r)
    consumer = f"{socket.gethostname()}-{os.getpid()}"
    total = 0
    for _ in range(max_batches):
        moved = drain_batch(r, consumer)
        total += moved
        if not moved:
            break
    return total


def drain_forever(*, interval: float = 1.0) -> None:
    """The same drain as a loop, for deployments without Celery beat (`python -m usage drain`)."""
    log.info("draining %s every %.1fs", RECORD_STREAM, interval)
    while True:
        # A connection PostgreSQL dropped (a restart, a failover) is closed here and the next pass opens a new
        # one; without this, every pass after a restart failed on the dead connection for ever.
        close_old_connections()
        try:
            if request_records_drain() == 0:
                time.sleep(interval)
        except (redis.RedisError, Exception):  # noqa: BLE001 - keep the loop alive; the stream keeps the records
            log.exception("drain pass failed")
            time.sleep(interval)
