"""Django admin: a window onto the domain whose every write goes through the same services as the API.

So an admin's change is validated, audited and announced exactly like a user's: quota and roles through the
team services, revocation through the credential services (the gateway hears of a revoked key at once), and
"delete" of a deployment is its teardown. Fields only services write are shown, never edited, and row deletes
that would skip a service are not offered.
"""
from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from deployments.cluster_config import cluster_config_errors
from deployments.errors import ActionError
from deployments.models import (AccessToken, ApiKey, Cluster, Deployment, Event, ExternalIdentity, Membership,
                                Rollout, ScimToken, Team)
from deployments.permissions import is_platform_admin
from deployments.services.access_tokens import access_token_revoke
from deployments.services.actions import deployment_delete
from deployments.services.api_keys import api_key_revoke, api_key_transfer_to_team
from deployments.services.clusters import cluster_register, cluster_update
from deployments.services.rollouts import rollout_abort, rollout_pause, rollout_resume
from deployments.services.people import (DETAILS, user_create, user_deactivate, user_delete, user_reactivate,
                                          user_update)
from deployments.services.scim import scim_token_create, scim_token_revoke
from deployments.secret_refs import secret_ref_errors
from deployments.services.teams import membership_remove, membership_set, platform_admin_set, team_create, team_update


def _adopt(obj, saved) -> None:
    """Make the admin's unsaved object the row a service created: inlines and the admin log need its pk."""
    obj.pk = saved.pk
    obj._state.adding = False
    obj.refresh_from_db()


def _apply(modeladmin, request, queryset, service, *, done: str) -> None:
    """Run `service` on each selected row; report what it did and, per row, why it refused."""
    count = 0
    for obj in queryset:
        try:
            service(obj)
        except ActionError as e:
            modeladmin.message_user(request, f"{obj}: {e.message}", messages.ERROR)
        else:
            count += 1
    if count:
        modeladmin.message_user(request, f"{done}: {count}.", messages.SUCCESS)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that only services write: viewable here, changed by the actions a subclass offers."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ["user", "role"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:  # moving a seat to someone else is a removal and an addition, each audited
            self.fields["user"].disabled = True


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "gpu_quota", "monthly_budget_usd", "allow_self_approval"]
    fields = ["slug", "name", "gpu_quota", "monthly_budget_usd", "allow_self_approval"]
    inlines = [MembershipInline]

    def save_model(self, request, obj, form, change):
        data = {f: form.cleaned_data[f] for f in self.fields}
        if change:
            team_update(actor=request.user, team=obj, **{f: data[f] for f in form.changed_data})
        else:
            _adopt(obj, team_create(actor=request.user, **data))

    def save_formset(self, request, form, formset, change):
        """Members are added, re-roled and removed by the membership services, never by the formset itself."""
        formset.save(commit=False)  # sorts the rows into new, changed and deleted (the admin log reads them)
        for m in formset.deleted_objects:
            membership_remove(actor=request.user, membership=m)
        for m in [*formset.new_objects, *(m for m, _ in formset.changed_objects)]:
            membership_set(actor=request.user, team=form.instance, user=m.user, role=m.role)

    def has_delete_permission(self, request, obj=None):
        return False  # a team's deployments and history outlive any wish to delete it


class ClusterForm(forms.ModelForm):
    """The API's checks of a registration or an edit, as form errors (the services refuse the same)."""

    class Meta:
        model = Cluster
        fields = ["name", "kind", "config", "secret_ref"]

    def clean_secret_ref(self):
        if problems := secret_ref_errors(self.cleaned_data["secret_ref"]):
            raise forms.ValidationError(problems)
        return self.cleaned_data["secret_ref"]

    def clean(self):
        data = super().clean()
        kind = data.get("kind") or self.instance.kind  # an edit shows the kind, read-only
        if errors := cluster_config_errors(kind, data.get("config") or {}):
            self.add_error("config", errors)
        return data


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    """Registration goes through `cluster_register`, an edit of its config or secret reference through
    `cluster_update` (name and kind stay); there is no service to remove a target."""

    form = ClusterForm
    list_display = ["name", "kind", "created_at"]
    fields = ["name", "kind", "config", "secret_ref"]

    def get_readonly_fields(self, request, obj=None):
        return ["name", "kind"] if obj else []

    def save_model(self, request, obj, form, change):
        if change:
            cluster_update(actor=request.user, cluster=obj, config=form.cleaned_data["config"],
                           secret_ref=form.cleaned_data["secret_ref"])
            obj.refresh_from_db()
        else:
            _adopt(obj, cluster_register(actor=request.user, **{f: form.cleaned_data[f] for f in self.fields}))

    def has_change_permission(self, request, obj=None):
        return is_platform_admin(request.user) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    """Requests, edits and approvals happen in the portal or the API; here an admin can only tear down."""

    list_display = ["name", "team", "cluster", "status", "generation", "observed_generation", "created_at"]
    list_filter = ["status", "cluster"]
    search_fields = ["name", "team__slug"]
    actions = ["tear_down"]

    @admin.action(description="Delete (tear down) selected deployments", permissions=["tear_down"])
    def tear_down(self, request, queryset):
        _apply(self, request, queryset, lambda d: deployment_delete(actor=request.user, deployment=d),
               done="Deleting")

    def has_tear_down_permission(self, request):
        # Deleting a deployment means tearing it down; the row and its history stay.
        return request.user.has_perm("deployments.delete_deployment")


@admin.register(Rollout)
class RolloutAdmin(ReadOnlyAdmin):
    """How each update reached its users, as the reconciler recorded it; pause, resume and abort go through
    deployments.services.rollouts (a platform admin steers any team's, as a team admin steers their own)."""

    list_display = ["deployment", "from_generation", "to_generation", "mode", "state", "paused", "weight",
                    "created_at", "finished_at"]
    list_filter = ["state", "mode", "paused"]
    search_fields = ["deployment__name", "deployment__team__slug"]
    list_select_related = ["deployment__team"]
    actions = ["pause", "resume", "abort"]

    @admin.action(description="Pause selected rollouts (traffic stays split as it is)", permissions=["steer"])
    def pause(self, request, queryset):
        _apply(self, request, queryset, lambda r: rollout_pause(actor=request.user, rollout=r), done="Paused")

    @admin.action(description="Resume selected rollouts", permissions=["steer"])
    def resume(self, request, queryset):
        _apply(self, request, queryset, lambda r: rollout_resume(actor=request.user, rollout=r), done="Resumed")

    @admin.action(description="Abort selected rollouts (every request back to the old generation)…",
                  permissions=["steer"])
    def abort(self, request, queryset):
        """First a page that asks for the reason, then the abort of each with it."""
        if "confirm" not in request.POST:
            return TemplateResponse(request, "admin/deployments/rollout/abort.html", {
                **self.admin_site.each_context(request), "opts": self.opts, "rollouts": queryset,
                "title": "Abort rollouts"})
        why = request.POST.get("reason", "")
        _apply(self, request, queryset, lambda r: rollout_abort(actor=request.user, rollout=r, reason=why),
               done="Aborted")
        return None

    def has_steer_permission(self, request):
        return request.user.has_perm("deployments.change_rollout")


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "kind", "team", "deployment", "actor"]
    list_filter = ["kind"]


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = ["name", "team", "owner", "key_id", "last4", "is_service", "revoked_at", "last_used_at"]
    list_filter = ["is_service"]
    exclude = ["digest"]
    actions = ["revoke", "transfer_to_team"]

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke(self, request, queryset):
        _apply(self, request, queryset, done="Revoked",
               service=lambda k: api_key_revoke(actor=request.user, key=k, message="Revoked in Django admin."))

    @admin.action(description="Move selected keys to their team (they stay when their owner leaves)",
                  permissions=["transfer"])
    def transfer_to_team(self, request, queryset):
        _apply(self, request, queryset, done="Moved to the team",
               service=lambda k: api_key_transfer_to_team(actor=request.user, key=k,
                                                          message="Moved to the team in Django admin."))

    def has_revoke_permission(self, request):
        return request.user.has_perm("deployments.change_apikey")

    has_transfer_permission = has_revoke_permission


@admin.register(AccessToken)
class AccessTokenAdmin(ReadOnlyAdmin):
    list_display = ["name", "user", "key_id", "last4", "revoked_at", "last_used_at"]
    exclude = ["digest"]
    actions = ["revoke"]

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        _apply(self, request, queryset, lambda t: access_token_revoke(user=request.user, token=t), done="Revoked")

    def has_revoke_permission(self, request):
        return request.user.has_perm("deployments.change_accesstoken")


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(ReadOnlyAdmin):
    """Who signs in as whom; linked on purpose with `manage.py identity_link` (audited)."""

    list_display = ["user", "issuer", "subject", "created_at", "last_seen_at"]
    list_filter = ["issuer"]
    search_fields = ["user__username", "subject"]


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class TandemUserAdmin(UserAdmin):
    """Django's user admin, with who exists, their details, who may sign in, who is a platform admin and deletion
    changed only through deployments.services.people and teams.platform_admin_set (audited; a deactivated user's
    keys, tokens and sessions go). Tandem's platform admin is `is_staff` and `is_superuser` together; Django's groups and
    permissions are not used."""

    PEOPLE_FIELDS = ["is_active", "is_staff", "is_superuser", "groups", "user_permissions"]
    actions = ["deactivate", "reactivate", "grant_platform_admin", "revoke_platform_admin"]
    list_display = ["username", "email", "first_name", "last_name", "is_active", "is_staff"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *self.PEOPLE_FIELDS] if obj else []

    def _people_action(self, request, queryset, service, *, done: str):
        why = "In Django admin."
        _apply(self, request, queryset, lambda u: service(actor=request.user, user=u, message=why), done=done)

    @admin.action(description="Deactivate selected users (memberships, keys, tokens and sessions go)",
                  permissions=["change"])
    def deactivate(self, request, queryset):
        self._people_action(request, queryset, user_deactivate, done="Deactivated")

    @admin.action(description="Reactivate selected users", permissions=["change"])
    def reactivate(self, request, queryset):
        self._people_action(request, queryset, user_reactivate, done="Reactivated")

    @admin.action(description="Make selected users platform admins", permissions=["change"])
    def grant_platform_admin(self, request, queryset):
        self._people_action(request, queryset, lambda **kw: platform_admin_set(is_admin=True, **kw), done="Granted")

    @admin.action(description="Make selected users no longer platform admins", permissions=["change"])
    def revoke_platform_admin(self, request, queryset):
        self._people_action(request, queryset, lambda **kw: platform_admin_set(is_admin=False, **kw),
                            done="Revoked")

    def save_model(self, request, obj, form, change):
        """A new user and a change of username, e-mail or name through the people services (audited)."""
        if change:
            user_update(actor=request.user, user=obj, message="In Django admin.",
                        **{f: form.cleaned_data[f] for f in form.changed_data if f in DETAILS})
        else:
            password = form.cleaned_data["password1"] if form.cleaned_data.get("set_usable_password") else None
            _adopt(obj, user_create(actor=request.user, username=obj.username, password=password,
                                    message="In Django admin."))

    def has_delete_permission(self, request, obj=None):
        # Nobody deletes themselves (user_delete refuses it too): the page would only end in an error.
        return obj != request.user and super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        """What the page lists, without asking for the right to delete the user's tokens and memberships row by
        row (not offered in their own admin pages): user_delete revokes and removes those itself, audited."""
        to_delete, model_count, _, protected = super().get_deleted_objects(objs, request)
        return to_delete, model_count, set(), protected

    def delete_model(self, request, obj):
        user_delete(actor=request.user, user=obj, message="In Django admin.")

    def delete_queryset(self, request, queryset):
        _apply(self, request, queryset, done="Deleted",
               service=lambda u: user_delete(actor=request.user, user=u, message="In Django admin."))


class ScimTokenForm(forms.ModelForm):
    class Meta:
        model = ScimToken
        fields = ["name"]


@admin.register(ScimToken)
class ScimTokenAdmin(ReadOnlyAdmin):
    """Tokens the company directory calls /scim/v2/ with: created here (the secret shown once, in the page that
    answers the save, never in a message, a log or the session) or by `manage.py tandem_scim_token`, revoked by the
    action; both audited."""

    form = ScimTokenForm
    list_display = ["name", "key_id", "last4", "created_by", "created_at", "revoked_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return is_platform_admin(request.user)

    def save_model(self, request, obj, form, change):
        token, obj.secret = scim_token_create(actor=request.user, name=form.cleaned_data["name"])
        _adopt(obj, token)

    def response_add(self, request, obj, post_url_continue=None):
        response = TemplateResponse(request, "admin/deployments/scimtoken/created.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "token": obj, "secret": obj.secret,
            "scim_url": request.build_absolute_uri("/scim/v2/"), "title": f"SCIM token {obj.name}"})
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected SCIM tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        _apply(self, request, queryset, lambda t: scim_token_revoke(actor=request.user, token=t), done="Revoked")

    def has_revoke_permission(self, request):
        return is_platform_admin(request.user)
