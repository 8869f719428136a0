from deployments.models.clusters import Cluster, ClusterCheck, ClusterCheckLine
from deployments.models.credentials import AccessToken, ApiKey
from deployments.models.deployments import Deployment
from deployments.models.events import Event
from deployments.models.identities import ExternalIdentity
from deployments.models.rollouts import Rollout
from deployments.models.scim import ScimGroup, ScimToken, ScimUser
from deployments.models.teams import Membership, Team

__all__ = ["AccessToken", "ApiKey", "Cluster", "ClusterCheck", "ClusterCheckLine", "Deployment", "Event",
           "ExternalIdentity", "Membership", "Rollout", "ScimGroup", "ScimToken", "ScimUser", "Team"]
