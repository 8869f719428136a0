from rest_framework.routers import DefaultRouter

from deployments.api import views

router = DefaultRouter()
router.register("teams", views.TeamViewSet, basename="team")
router.register("members", views.MembershipViewSet, basename="member")
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("events", views.EventViewSet, basename="event")
router.register("tokens", views.AccessTokenViewSet, basename="token")
router.register("api-keys", views.ApiKeyViewSet, basename="apikey")
router.register("users", views.UserViewSet, basename="user")

urlpatterns = router.urls
