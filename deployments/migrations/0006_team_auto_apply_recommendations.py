"""Teams may let Tandem apply the advisor's recommendations within the approved replica bounds (off by default)."""
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("deployments", "0005_pause_statuses_budgets_and_ready_estimate")]

    operations = [
        migrations.AddField(
            model_name="team",
            name="auto_apply_recommendations",
            field=models.BooleanField(default=False, help_text="Tandem may apply the advisor's recommendations "
                                      "itself, within the replica bounds already approved (an audited event each "
                                      "time)."),
        ),
    ]
