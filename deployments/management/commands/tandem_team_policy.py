"""`manage.py tandem_team_policy CLUSTER TEAM`: the IAM policy of a team's Ray pod role on an eks cluster."""
import json

from django.core.management.base import BaseCommand, CommandError

from deployments.models import Cluster, Team
from deployments.team_roles import team_role_arn, team_weights_policy


class Command(BaseCommand):
    help = "Print the S3 read policy for the role a team's Ray pods assume on a cluster (its model_sources only)."

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("team")

    def handle(self, *args, cluster, team, **options):
        c = Cluster.objects.filter(name=cluster).first()
        t = Team.objects.filter(slug=team).first()
        if c is None or t is None:
            raise CommandError(f"No cluster {cluster!r}" if c is None else f"No team {team!r}")
        if c.kind != Cluster.Kind.EKS:
            raise CommandError(f"Cluster {cluster} is a {c.kind} cluster: team roles (IRSA) are for eks clusters.")
        policy = team_weights_policy(c.config_typed, t.slug)
        if not policy["Statement"]:
            raise CommandError(f"Cluster {cluster} lets team {team} read no S3 weights (model_sources).")
        if team_role_arn(c.config_typed, t.slug) is None:
            self.stderr.write(f"Note: cluster {cluster} names no role for {team} in team_roles yet.")
        self.stdout.write(json.dumps(policy, indent=2))
