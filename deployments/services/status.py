"""Writes of what workers observe (conditions, endpoint, observed generation), only when it changed."""
from django.db import transaction

from deployments.models import Deployment


@transaction.atomic
def deployment_observe(*, deployment_id: int, **fields) -> bool:
    """Store observed fields; returns True when anything changed."""
    d = Deployment.objects.select_for_update().get(pk=deployment_id)
    changed = {k: v for k, v in fields.items() if getattr(d, k) != v}
    if not changed:
        return False
    for k, v in changed.items():
        setattr(d, k, v)
    d.save(update_fields=[*changed, "updated_at"])
    return True
