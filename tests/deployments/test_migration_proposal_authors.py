"""0017_perms_proposal_authors: a row from before `proposed_by` existed that waits for a decision gets the author
the readers used to assume (its requester), so they read `proposed_by` alone."""
import importlib

import pytest
from django.apps import apps

from deployments.models import Deployment
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db
migration = importlib.import_module("deployments.migrations.0017_perms_proposal_authors")


def test_what_waits_without_an_author_gets_its_requester_and_nothing_else_changes():
    request = DeploymentFactory(status="pending_approval")
    update = DeploymentFactory(status="running")
    update.proposed_spec = update.spec
    update.save()
    settled = DeploymentFactory(status="running")
    someone_else = DeploymentFactory(status="pending_approval").requested_by
    edited = DeploymentFactory(status="pending_approval", proposed_by=someone_else)
    # As a row from before 0003 reads: nothing names an author.
    Deployment.objects.filter(pk__in=[request.pk, update.pk, settled.pk]).update(proposed_by=None)

    migration.proposal_authors(apps, None)

    authors = dict(Deployment.objects.values_list("pk", "proposed_by"))
    assert authors[request.pk] == request.requested_by.pk and authors[update.pk] == update.requested_by.pk
    assert authors[settled.pk] is None and authors[edited.pk] == someone_else.pk
