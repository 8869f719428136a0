"""Stored observations: per-minute rollups, scrape state, conformance runs and their checks."""
from django.db import models


class StageRollup(models.Model):
    """One deployment's latency (or size) histogram increase in one minute, for one stage of one pool.

    Buckets are kept so percentiles over any set of minutes stay exact to the bucket. Times are in ms,
    `kv_bytes` in bytes.
    """

    class Source(models.TextChoices):
        ENGINE = "engine"
        GATEWAY = "gateway"

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="stage_rollups")
    minute = models.DateTimeField()
    stage = models.CharField(max_length=20)
    source = models.CharField(max_length=8, choices=Source.choices)
    pool = models.CharField(max_length=10)  # prefill, decode, ingress, gateway
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0.0)
    bounds = models.JSONField(default=list)  # finite upper bounds; +Inf is implicit
    counts = models.JSONField(default=list)  # per bucket (not cumulative), len(bounds) + 1

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "minute", "stage", "source", "pool"],
                                               name="one_stage_rollup_per_minute")]
        indexes = [models.Index(fields=["deployment", "minute"]), models.Index(fields=["minute"])]


class ValueRollup(models.Model):
    """A counter's increase (tokens by source, failed transfers) or a gauge's peak (KV cache usage,
    running, waiting) for one deployment, minute and pool."""

    class Kind(models.TextChoices):
        INCREASE = "increase"
        PEAK = "peak"

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="value_rollups")
    minute = models.DateTimeField()
    name = models.CharField(max_length=60)
    pool = models.CharField(max_length=10)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "minute", "name", "pool"],
                                               name="one_value_rollup_per_minute")]
        indexes = [models.Index(fields=["deployment", "minute"]), models.Index(fields=["minute"])]


class ThroughputRollup(models.Model):
    """Requests and tokens the gateway served for one deployment in one minute."""

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="throughput_rollups")
    minute = models.DateTimeField()
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "minute"], name="one_throughput_per_minute")]
        indexes = [models.Index(fields=["minute"])]


class ScrapeState(models.Model):
    """The last scrape of a deployment's metrics: the baseline the next scrape's increase is taken from."""

    deployment = models.OneToOneField("deployments.Deployment", on_delete=models.CASCADE,
                                      related_name="scrape_state")
    scraped_at = models.DateTimeField(null=True, blank=True)
    snapshot = models.JSONField(default=dict)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    # The decode pool's KV reads as the last two scrapes saw them (observability.pd_health.kv_reads), and since when
    # every read has failed (None: they have not, or succeeded since). The reconciler acts on it (workers.pipeline).
    kv_reads = models.JSONField(default=dict)
    kv_failing_since = models.DateTimeField(null=True, blank=True)


class ConformanceRun(models.Model):
    """One run of the OpenAI-conformance suite through the gateway, with the PD-health verdict beside it."""

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="conformance_runs")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    base_url = models.URLField()
    model = models.CharField(max_length=128)
    generation = models.PositiveIntegerField(default=0, help_text="The deployment generation this run checked.")
    passed = models.BooleanField(default=False)
    summary = models.TextField(blank=True)
    pd_health = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["deployment", "-started_at"])]


class ConformanceCheck(models.Model):
    """One check of a run: what was asked, and what was observed."""

    run = models.ForeignKey(ConformanceRun, on_delete=models.CASCADE, related_name="checks")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=60)
    passed = models.BooleanField()
    evidence = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "position"]
