"""Per-request timing and usage: a small record filled on the hot path, shipped to a Redis stream in batches."""
import asyncio
import io
import logging
import sys
import time

import orjson
from redis.exceptions import RedisError

from controlplane.record_stream import RECORD_STREAM
from gateway import clock, metrics
from gateway.config import RECORD_STREAM_MAXLEN, RECORDS_PER_ENTRY

log = logging.getLogger("gateway.access")

MAX_BUFFERED = 200_000  # records kept in memory while Redis is away, then the oldest are dropped


class Record:
    """One request; timestamps come from perf_counter, `created_at` from the gateway's wall clock (gateway/clock.py)."""

    __slots__ = ("request_id", "client_request_id", "created_at", "t0", "endpoint", "stream", "model", "key_pk",
                 "key_id", "deployment_id", "status_code", "error_type", "prompt_tokens", "completion_tokens", "partial",
                 "ttft_ms", "e2e_ms", "mean_itl_ms", "max_itl_ms", "bytes_out", "generation", "_last", "chunks",
                 "_gap_sum", "_gap_max")

    def __init__(self, request_id: str, endpoint: str, client_request_id: str = ""):
        self.request_id = request_id
        self.client_request_id = client_request_id
        self.created_at = clock.now()
        self.t0 = time.perf_counter()
        self.endpoint = endpoint
        self.stream = False
        self.model = ""
        self.key_pk = self.deployment_id = None
        self.key_id = ""
        self.status_code = 0
        self.error_type = ""
        self.prompt_tokens = self.completion_tokens = self.bytes_out = 0
        self.partial = False
        self.ttft_ms = self.mean_itl_ms = self.max_itl_ms = None
        self.e2e_ms = 0.0
        self.generation = None  # the deployment's generation that served it (None: routing never got that far)
        self._last = 0.0
        self.chunks = 0
        self._gap_sum = 0.0
        self._gap_max = 0.0

    def chunk_sent(self, nbytes: int) -> None:
        """Called right after each streamed chunk is handed to the server: TTFT and the gaps between chunks."""
        now = time.perf_counter()
        if self.chunks == 0:
            self.ttft_ms = (now - self.t0) * 1000
        else:
            gap = now - self._last
            self._gap_sum += gap
            if gap > self._gap_max:
                self._gap_max = gap
        self._last = now
        self.chunks += 1
        self.bytes_out += nbytes

    def finish(self, status_code: int) -> None:
        self.status_code = status_code
        self.e2e_ms = (time.perf_counter() - self.t0) * 1000
        if self.chunks > 1:
            self.mean_itl_ms = self._gap_sum / (self.chunks - 1) * 1000
            self.max_itl_ms = self._gap_max * 1000

    def as_dict(self) -> dict:
        return {
            "request_id": self.request_id, "client_request_id": self.client_request_id,
            "created_at": self.created_at, "endpoint": self.endpoint,
            "stream": self.stream, "model": self.model, "api_key_id": self.key_pk, "key_id": self.key_id,
            "deployment_id": self.deployment_id, "status_code": self.status_code, "error_type": self.error_type,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "partial": self.partial, "ttft_ms": self.ttft_ms, "e2e_ms": self.e2e_ms,
            "mean_itl_ms": self.mean_itl_ms, "max_itl_ms": self.max_itl_ms, "bytes_out": self.bytes_out,
            "generation": self.generation,
        }


class Recorder:
    """Collects finished records and, every `interval`, writes them to Redis, Prometheus and the access log."""

    def __init__(self, redis, *, interval: float, access_log: bool):
        self._redis = redis
        self._interval = interval
        self._access_log = access_log and log.isEnabledFor(logging.INFO)
        self._out = sys.stderr.buffer
        self._buffer: list[Record] = []
        self._unsent: list[Record] = []  # records Redis refused; retried with the next batch

    def add(self, rec: Record) -> None:
        self._buffer.append(rec)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self._buffer or self._unsent:
                await self.flush()

    async def flush(self) -> None:
        batch, self._buffer = self._buffer, []
        for rec in batch:
            metrics.observe(rec)
        if self._access_log:
            self._write_access_log(batch)
        batch, self._unsent = self._unsent + batch, []
        pipe = self._redis.pipeline(transaction=False)
        usage = [rec.as_dict() for rec in batch if rec.key_pk is not None]  # no valid key: nobody's usage
        for i in range(0, len(usage), RECORDS_PER_ENTRY):
            pipe.xadd(RECORD_STREAM, {"b": orjson.dumps(usage[i:i + RECORDS_PER_ENTRY])}, maxlen=RECORD_STREAM_MAXLEN,
                      approximate=True)
        try:
            await pipe.execute()
        except RedisError:
            log.warning("could not write %d request records to Redis; will retry", len(batch), exc_info=True)
            self._unsent = batch[-MAX_BUFFERED:]
            if len(batch) > MAX_BUFFERED:
                metrics.RECORDS_DROPPED.inc(len(batch) - MAX_BUFFERED)

    @property
    def pending(self) -> int:
        return len(self._buffer) + len(self._unsent)

    def _write_access_log(self, batch: list[Record]) -> None:
        """One JSON line per request, shaped like controlplane.request_id.JsonFormatter's, written in one call
        per batch: going through `logging` record by record cost the gateway a fifth of its throughput. Each line
        is copied into one buffer as soon as it is encoded: keeping a batch of orjson's results alive to join them
        cost 3.5 us a line, fourteen times the encoding itself (bench/README)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        buffer = io.BytesIO()
        write, newline = buffer.write, orjson.OPT_APPEND_NEWLINE
        for rec in batch:
            write(orjson.dumps({
                "time": now, "level": "INFO", "logger": "gateway.access", "request_id": rec.request_id,
                "client_request_id": rec.client_request_id or None,
                "message": f"{rec.endpoint} {rec.status_code}", "status": rec.status_code, "endpoint": rec.endpoint,
                "stream": rec.stream, "model": rec.model, "deployment": rec.deployment_id, "key_id": rec.key_id,
                "ttft_ms": rec.ttft_ms, "e2e_ms": round(rec.e2e_ms, 3), "prompt_tokens": rec.prompt_tokens,
                "completion_tokens": rec.completion_tokens, "bytes": rec.bytes_out, "partial": rec.partial,
                "error": rec.error_type or None}, option=newline))
        try:
            self._out.write(buffer.getbuffer())
            self._out.flush()
        except (OSError, ValueError):
            pass  # a closed or broken log pipe must not stop accounting
