from django.conf import settings
from django.db import models


class Team(models.Model):
    """A group of people who share deployments, API keys and a GPU quota."""

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=100)
    gpu_quota = models.PositiveIntegerField(default=0, help_text="GPUs the team's deployments may hold at once.")
    allow_self_approval = models.BooleanField(
        default=False, help_text="Team admins may approve their own requests."
    )
    auto_apply_recommendations = models.BooleanField(
        default=False, help_text="Tandem may apply the advisor's recommendations itself, within the replica bounds "
                                 "already approved (an audited event each time).")
    # Lifetimes of the team's API keys (and of its members' access tokens: a user's strictest team applies).
    credential_default_days = models.PositiveIntegerField(
        default=90, help_text="Days a new key or token lives when its creator names no expiry."
    )
    credential_max_days = models.PositiveIntegerField(
        default=365, help_text="The longest a key or token may live, in days."
    )
    monthly_budget_usd = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Whole USD a month; at 80% the team's admins are told, at 100% what raises the hourly cost needs a "
                  "platform admin's approval. Nothing running is stopped.")
    # The month ("2026-12") the 80% warning went out for: one warning a month (deployments.services.budgets).
    budget_warned_month = models.CharField(max_length=7, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug


class Membership(models.Model):
    """A user's role in a team: members request, admins also approve."""

    class Role(models.TextChoices):
        MEMBER = "member"
        ADMIN = "admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]
        ordering = ["team__slug", "user__username"]

    def __str__(self):
        return f"{self.user} in {self.team} ({self.role})"
