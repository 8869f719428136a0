"""Content hashes of JSON values, defined once so every drift check (a manifest's spec-hash annotation, a Serve
application on a Ray cluster, a deployment's applied hash) compares hashes made the same way."""
import hashlib
import json


def content_hash(obj) -> str:
    """A stable SHA-256 of any JSON-able value: sorted keys and no whitespace, so equal values hash equal."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
