"""Per-key requests/min and tokens/min from the ApiKey row, counted in Redis in fixed one-minute windows."""
import logging
import math
import time

from redis.exceptions import RedisError

from gateway.errors import rate_limited

log = logging.getLogger(__name__)


def _keys(key_id: str, window: int) -> tuple[str, str]:
    return f"tandem:rl:{key_id}:{window}:r", f"tandem:rl:{key_id}:{window}:t"


class RateLimiter:
    """Fixed windows shared by every replica: one Redis round trip per request, and only for keys with limits.

    Tokens are added after a request finishes (by the recorder, off the hot path), so a burst can overshoot the
    token limit by the requests already in flight; the next request in that minute is refused.
    """

    def __init__(self, redis):
        self._redis = redis

    async def check(self, key) -> None:
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        if not rpm and not tpm:
            return
        now = time.time()
        window = int(now // 60)
        req_key, tok_key = _keys(key.key_id, window)
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.incr(req_key)
            pipe.expire(req_key, 120)
            pipe.get(tok_key)
            count, _, tokens = await pipe.execute()
        except RedisError:
            # Limits are a fairness tool, not auth: an unavailable Redis must not take traffic down.
            log.warning("rate limit counters unavailable; letting the request through", exc_info=True)
            return
        retry_after = max(1, math.ceil(60 - (now % 60)))
        if rpm and count > rpm:
            raise rate_limited("requests", retry_after)
        if tpm and tokens is not None and int(tokens) >= tpm:
            raise rate_limited("tokens", retry_after)

    @staticmethod
    def add_tokens(pipe, records) -> None:
        """Queue INCRBYs on `pipe` for the tokens these finished requests used (keys with a token limit only)."""
        for rec in records:
            if rec.tpm and (rec.prompt_tokens or rec.completion_tokens):
                _, tok_key = _keys(rec.key_id, int(rec.created_at // 60))
                pipe.incrby(tok_key, rec.prompt_tokens + rec.completion_tokens)
                pipe.expire(tok_key, 120)
