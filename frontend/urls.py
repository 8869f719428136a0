"""URL routes of the portal (included at "/")."""
from django.urls import path
from django.views.generic import RedirectView

from frontend.views import advice, approvals, clusters, cost, deployments, keys, requests, rollouts, teams, tokens

app_name = "frontend"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="frontend:deployments"), name="home"),
    path("deployments/", deployments.deployment_list, name="deployments"),
    path("deployments/new/", requests.deployment_new, name="deployment-new"),
    path("deployments/validate/", requests.deployment_validate, name="deployment-validate"),
    path("deployments/<int:pk>/", deployments.deployment_detail, name="deployment-detail"),
    path("deployments/<int:pk>/status/", deployments.deployment_status, name="deployment-status"),
    path("deployments/<int:pk>/edit/", requests.deployment_edit, name="deployment-edit"),
    path("deployments/<int:pk>/approve/", deployments.deployment_approve, name="deployment-approve"),
    path("deployments/<int:pk>/reject/", deployments.deployment_reject, name="deployment-reject"),
    path("deployments/<int:pk>/withdraw/", deployments.deployment_withdraw, name="deployment-withdraw"),
    path("deployments/<int:pk>/retry/", deployments.deployment_retry, name="deployment-retry"),
    path("deployments/<int:pk>/delete/", deployments.deployment_delete, name="deployment-delete"),
    path("deployments/<int:pk>/pause/", cost.deployment_pause, name="deployment-pause"),
    path("deployments/<int:pk>/resume/", cost.deployment_resume, name="deployment-resume"),
    path("deployments/<int:pk>/targets/", advice.deployment_targets, name="deployment-targets"),
    path("deployments/<int:pk>/recommendations/<str:rec_id>/apply/", advice.deployment_recommendation_apply,
         name="deployment-recommendation-apply"),
    path("deployments/<int:pk>/rollouts/<int:rollout_id>/pause/", rollouts.rollout_pause, name="rollout-pause"),
    path("deployments/<int:pk>/rollouts/<int:rollout_id>/resume/", rollouts.rollout_resume, name="rollout-resume"),
    path("deployments/<int:pk>/rollouts/<int:rollout_id>/abort/", rollouts.rollout_abort, name="rollout-abort"),
    path("approvals/", approvals.approval_queue, name="approvals"),
    path("clusters/<slug:name>/", clusters.cluster_detail, name="cluster-detail"),
    path("clusters/<slug:name>/checks/", clusters.cluster_checks_panel, name="cluster-checks"),
    path("clusters/<slug:name>/check/", clusters.cluster_check, name="cluster-check"),
    path("keys/", keys.api_key_list, name="api-keys"),
    path("keys/<int:pk>/revoke/", keys.api_key_revoke, name="api-key-revoke"),
    path("keys/<int:pk>/transfer/", keys.api_key_transfer, name="api-key-transfer"),
    path("tokens/", tokens.token_list, name="tokens"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token-revoke"),
    path("team/", teams.team_detail, name="team"),
    path("team/switch/", teams.team_switch, name="team-switch"),
    path("team/cost/", cost.team_cost, name="team-cost"),
    path("team/auto-apply/", advice.team_auto_apply, name="team-auto-apply"),
]
