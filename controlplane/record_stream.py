"""The Redis stream between the gateway and the usage app: the one thing both sides must agree on.

The gateway (gateway.timing) appends request records to it, each entry either a JSON list of records in field `b`
or one record in field `r`; the usage app's drain (usage.drain) moves them into PostgreSQL. Neither side imports
the other, so the stream's name lives here, below both.
"""
RECORD_STREAM = "tandem:gateway:requests"
