"""The wall clock of the gateway's per-minute windows: rate limits count in the minute it reads, and each request
record's `created_at` (which decides the minute a request's tokens count in) comes from it too.

It is `time.time()` shifted by `TANDEM_GATEWAY_CLOCK_OFFSET_S` (0 unless set); time still passes at its real rate.
Tests start a gateway with its clock at the start of a minute, so requests that must share one window do,
without waiting for a new minute of the real clock."""
import time

from django.conf import settings

_offset_s: float | None = None


def now() -> float:
    global _offset_s
    if _offset_s is None:  # read once: this is on every request's path
        _offset_s = settings.TANDEM_GATEWAY_CLOCK_OFFSET_S
    return time.time() + _offset_s
