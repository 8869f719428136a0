"""`python -m usage drain` (the drain for installs without Celery beat) as a real process, through a
PostgreSQL restart: every record reaches the database once PostgreSQL is back."""
import subprocess
import sys
import time

import httpx

from tests.gateway.test_errors import CHAT
from tests.gateway.test_hostile import _proxied, _through
from tests.support import processes
from tests.support.processes import wait_for
from usage.models import RequestRecord


def test_the_drain_process_recovers_when_postgresql_drops_its_connections(world, gateway, tmp_path):
    world.deployment("m")
    _, raw = world.key()
    pg = _proxied(processes.test_database_url())
    env = processes.worker_environment(tmp_path, DATABASE_URL=_through(processes.test_database_url(), pg))
    log = tmp_path / "drain.log"
    drain = subprocess.Popen([sys.executable, "-m", "usage", "drain", "--interval", "0.2"], cwd=processes.ROOT,
                             env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def ask(rid: str) -> int:
        return httpx.post(gateway.base_url + "/v1/chat/completions", json={"model": "m", **CHAT}, timeout=20,
                          headers={"Authorization": f"Bearer {raw}", "X-Request-ID": rid}).status_code

    def recorded(rid: str) -> bool:
        return RequestRecord.objects.filter(client_request_id=rid).exists()

    try:
        assert ask("before-restart") == 200
        wait_for(lambda: recorded("before-restart"), timeout=10, every=0.1)
        pg.cut()  # as a restart does: every connection dropped, new ones refused for a while
        assert ask("during-restart") == 200
        time.sleep(1.0)  # several drain passes fail meanwhile
        pg.restore()
        restored = time.monotonic()
        assert ask("after-restart") == 200
        try:
            wait_for(lambda: recorded("during-restart") and recorded("after-restart"), timeout=10, every=0.1,
                     what="the requests made during and after the restart to be recorded")
        except AssertionError as e:  # with what the drain said meanwhile
            raise AssertionError(f"{e}; the drain's log ends: {log.read_text()[-2000:]}") from None
        print(f"drain caught up {time.monotonic() - restored:.2f} s after PostgreSQL came back")
        assert RequestRecord.objects.filter(client_request_id__endswith="-restart").count() == 3
    finally:
        drain.terminate()
        drain.wait(10)
        pg.close()
