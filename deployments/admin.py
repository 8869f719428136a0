from django.contrib import admin

from deployments.models import AccessToken, ApiKey, Cluster, Deployment, Event, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "gpu_quota", "allow_self_approval"]
    inlines = [MembershipInline]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "created_at"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "cluster", "status", "generation", "observed_generation", "created_at"]
    list_filter = ["status", "cluster"]
    search_fields = ["name", "team__slug"]
    readonly_fields = ["status", "status_reason", "conditions", "observed_generation", "applied_hash"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "team", "deployment", "actor"]
    list_filter = ["kind"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "key_id", "last4", "revoked_at", "last_used_at"]
    exclude = ["digest"]
    readonly_fields = ["key_id", "last4"]


@admin.register(AccessToken)
class AccessTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "key_id", "last4", "revoked_at", "last_used_at"]
    exclude = ["digest"]
    readonly_fields = ["key_id", "last4"]
