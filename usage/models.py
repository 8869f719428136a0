from django.db import models


class RequestRecord(models.Model):
    """One request through the gateway: who, what, how many tokens, and how long each part took.

    Written off the hot path (the gateway appends to a Redis stream; a worker drains it here).
    """

    # The gateway's own id for the request (also sent upstream); never the client's, which anyone can repeat.
    request_id = models.CharField(max_length=128, unique=True)
    client_request_id = models.CharField(max_length=128, blank=True,
                                         help_text="The client's X-Request-ID, as given (not unique).")
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="requests",
                                   null=True)
    api_key = models.ForeignKey("deployments.ApiKey", on_delete=models.SET_NULL, related_name="requests", null=True)
    created_at = models.DateTimeField(db_index=True)
    endpoint = models.CharField(max_length=40)  # chat.completions, completions, embeddings
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()
    error_type = models.CharField(max_length=60, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    partial = models.BooleanField(default=False, help_text="The stream ended early (client left or upstream dropped).")
    ttft_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField()
    mean_itl_ms = models.FloatField(null=True, blank=True)
    max_itl_ms = models.FloatField(null=True, blank=True)
    bytes_out = models.PositiveBigIntegerField(default=0)
    generation = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="The deployment's generation that served it.")

    class Meta:
        # The table the gateway app created, kept when the model moved here (usage/migrations/0001_initial.py).
        db_table = "gateway_requestrecord"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["deployment", "created_at"]), models.Index(fields=["api_key", "created_at"])]
