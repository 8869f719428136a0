from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('observability', '0002_conformance_run_generation'),
    ]

    operations = [
        migrations.AddField(
            model_name='scrapestate',
            name='kv_reads',
            field=models.JSONField(default=dict),
        ),
        migrations.AddField(
            model_name='scrapestate',
            name='kv_failing_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
