"""Everything that waits for a decision names its author. Since 0003 every writer sets `proposed_by` with what
waits (a request, its edits, a proposed update) and a user who authored one cannot be deleted (PROTECT), so only a
row from before 0003 can wait with no author: readers used to fall back to the requester for it. This gives such a
row the author the readers already assumed, so they no longer need the fallback."""
from django.db import migrations
from django.db.models import F, Q


def proposal_authors(apps, schema_editor):
    Deployment = apps.get_model("deployments", "Deployment")
    Deployment.objects.filter(Q(proposed_spec__isnull=False) | Q(status="pending_approval"),
                              proposed_by__isnull=True).update(proposed_by=F("requested_by"))


class Migration(migrations.Migration):
    dependencies = [("deployments", "0016_event_kinds_of_issue_29")]
    operations = [migrations.RunPython(proposal_authors, migrations.RunPython.noop)]
