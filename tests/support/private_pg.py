"""A PostgreSQL server of a test's own (initdb + pg_ctl on a free port), so the test can restart it while
Tandem's processes run, without touching the shared server the rest of the suite uses."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import free_port

BIN = Path("/usr/local/bin")


class PrivatePostgres:
    def __init__(self):
        # Not under pytest's tmp_path: the server runs as `postgres` when the tests run as root, and pytest's
        # directories are private to their owner.
        self.root = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = free_port()

    def _run(self, *cmd: str) -> None:
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> "PrivatePostgres":
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")
        return self

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session is ended (their advisory locks with them), then it is back."""
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-m", "fast", "-w", "restart")

    def stop(self) -> None:
        try:
            self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def copy_of(self, source_url: str, dbname: str) -> str:
        """A new database here holding what `source_url` holds now (schema and rows); returns its URL."""
        subprocess.run(["psql", "-q", self.url(), "-c", f'CREATE DATABASE "{dbname}"'], check=True,
                       capture_output=True, timeout=30)
        dump = subprocess.run(["pg_dump", "--no-owner", source_url], check=True, capture_output=True, timeout=60)
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", self.url(dbname)], input=dump.stdout, check=True,
                       capture_output=True, timeout=60)
        return self.url(dbname)
