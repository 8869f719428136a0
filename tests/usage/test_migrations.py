"""The request records moved from the gateway app to the usage app without moving a byte: a database that the
gateway app migrated keeps its table, its rows and its name, and `migrate` has nothing to run for it."""
import datetime as dt

from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from tests.factories import DeploymentFactory
from usage.models import RequestRecord

GATEWAY_MIGRATIONS = ("0001_initial", "0002_client_request_id_beside_the_gateways_own")
# The usage app's own migrations since the move: an upgrade from the gateway app runs these, and only these.
SINCE_THE_MOVE = [("usage", "0003_request_generation")]


def _as_the_gateway_app_left_it() -> None:
    """django_migrations and the table as they were before the move: the gateway app's two migrations applied, none
    of usage's (nor the columns its later migrations add)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE gateway_requestrecord DROP COLUMN generation")
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app="usage").delete()
    for name in GATEWAY_MIGRATIONS:
        recorder.record_applied("gateway", name)


def test_a_database_the_gateway_app_migrated_keeps_its_request_records(db):
    deployment = DeploymentFactory()
    _as_the_gateway_app_left_it()
    with connection.cursor() as cursor:  # a row written before the move, by SQL: the model is not the gateway's
        cursor.execute("INSERT INTO gateway_requestrecord (request_id, client_request_id, deployment_id, created_at,"
                       " endpoint, stream, status_code, error_type, prompt_tokens, completion_tokens, partial, e2e_ms,"
                       " bytes_out) VALUES ('before-the-move', 'theirs', %s, %s, 'chat.completions', false, 200, '',"
                       " 12, 34, false, 56.0, 789)", [deployment.pk, dt.datetime(2026, 12, 1, tzinfo=dt.UTC)])
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # check its key now: the migration below alters the table

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    assert [(m.app_label, m.name) for m, _ in plan] == SINCE_THE_MOVE  # no table created, none rebuilt
    call_command("migrate", verbosity=0)  # what an upgrade runs

    record = RequestRecord.objects.get(request_id="before-the-move")
    assert (record.client_request_id, record.deployment, record.prompt_tokens, record.completion_tokens) == \
        ("theirs", deployment, 12, 34)
    assert deployment.requests.get() == record
    applied = MigrationRecorder(connection).applied_migrations()
    assert {("usage", name) for name in GATEWAY_MIGRATIONS} <= set(applied)


def test_a_database_between_the_gateway_apps_two_migrations_gets_the_second_as_the_usage_apps(db):
    """An install that stopped after the gateway app's first migration: the second runs as usage's, once."""
    _as_the_gateway_app_left_it()
    MigrationRecorder(connection).migration_qs.filter(app="gateway", name=GATEWAY_MIGRATIONS[1]).delete()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE gateway_requestrecord DROP COLUMN client_request_id")

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    assert [(m.app_label, m.name) for m, backwards in plan] == [("usage", GATEWAY_MIGRATIONS[1]), *SINCE_THE_MOVE]
    executor.migrate(executor.loader.graph.leaf_nodes())

    RequestRecord.objects.create(request_id="after", client_request_id="c", created_at=dt.datetime.now(dt.UTC),
                                 endpoint="completions", status_code=200, e2e_ms=1.0)
    assert RequestRecord.objects.get(request_id="after").client_request_id == "c"
