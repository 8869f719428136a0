"""TLS to the external PostgreSQL and Redis, as docs/install.md writes the URLs, reaches every client Tandem builds."""
import ssl

import dj_database_url
import redis
from psycopg.conninfo import conninfo_to_dict

from gateway.config import database_conninfo

DATABASE_URL = ("postgres://tandem:pw@tandem.abc.us-east-1.rds.amazonaws.com:5432/tandem"
                "?sslmode=verify-full&sslrootcert=/etc/tandem/rds/global-bundle.pem")
REDIS_URL = "rediss://:token@master.tandem.abc.use1.cache.amazonaws.com:6379/0?ssl_cert_reqs=required"


def test_the_gateways_own_pool_keeps_verify_full(settings):
    settings.DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
    info = conninfo_to_dict(database_conninfo())
    assert info["sslmode"] == "verify-full" and info["sslrootcert"] == "/etc/tandem/rds/global-bundle.pem"
    assert info["host"] == "tandem.abc.us-east-1.rds.amazonaws.com"


def test_rediss_urls_check_the_server_certificate():
    pool = redis.Redis.from_url(REDIS_URL).connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.make_connection().cert_reqs == ssl.CERT_REQUIRED
