"""The process's shared Redis client: built once, and safe to use on both sides of a Celery prefork fork."""
import os

import pytest

from controlplane.redis_client import redis_client as shared_redis


# The child only talks to Redis and leaves with os._exit, so threads left in the parent cannot deadlock it.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_the_shared_client_is_reused_and_a_forked_child_gets_its_own_connection(redis_client):
    r = shared_redis()
    assert shared_redis() is r  # one pool per process, not one per call
    parent_connection = r.client_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, as a prefork worker: the same client object, used without any setup
        try:
            os.write(write, str(shared_redis().client_id()).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child_connection = int(os.read(read, 64) or b"0")
    os.close(read)

    assert child_connection not in (0, parent_connection)  # it answered, on a socket of its own
    assert r.client_id() == parent_connection  # and the parent's connection is still intact
