"""Writes of what workers observe (conditions, endpoint, observed generation), only when it changed."""
from django.db import transaction
from django.utils import timezone

from deployments.conditions import condition_set
from deployments.models import Deployment


@transaction.atomic
def deployment_observe(*, deployment_id: int, condition_updates: dict[str, dict] | None = None, **fields) -> bool:
    """Store observed fields; returns True when anything changed.

    `condition_updates` ({type: condition_set's status, reason, message and generation}) is merged into the
    conditions as they are now, under the row lock, so the reconciler and the conformance runner never drop each
    other's conditions."""
    d = Deployment.objects.select_for_update().get(pk=deployment_id)
    if condition_updates:
        conditions = fields.get("conditions", d.conditions)
        for type, update in condition_updates.items():
            conditions = condition_set(conditions, type=type, now=timezone.now(), **update)
        fields["conditions"] = conditions
    changed = {k: v for k, v in fields.items() if getattr(d, k) != v}
    if not changed:
        return False
    for k, v in changed.items():
        setattr(d, k, v)
    d.save(update_fields=[*changed, "updated_at"])
    return True
