"""The team admins' pause, resume and abort of a deployment's rollout in the portal (its panel:
frontend.rollout_panel), through deployments.services.rollouts."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_POST

from deployments import selectors
from deployments.services import rollouts
from frontend.views.deployments import _act, _visible


def _rollout_action(request, pk: int, rollout_id: int, service, done: str, **arguments):
    d = _visible(request, pk)
    r = get_object_or_404(selectors.rollouts_of(d), pk=rollout_id)
    return _act(request, d, lambda: service(actor=request.user, rollout=r, **arguments), done)


@login_required
@require_POST
def rollout_pause(request, pk: int, rollout_id: int):
    """Hold the rollout at its step (team admins)."""
    return _rollout_action(request, pk, rollout_id, rollouts.rollout_pause,
                           "Rollout paused: traffic stays split as it is until you resume or abort it.")


@login_required
@require_POST
def rollout_resume(request, pk: int, rollout_id: int):
    """Go on from the step it was held at (team admins)."""
    return _rollout_action(request, pk, rollout_id, rollouts.rollout_resume, "Rollout resumed.")


@login_required
@require_POST
def rollout_abort(request, pk: int, rollout_id: int):
    """Move every request back to the old generation, with the reason the form asks for (team admins)."""
    return _rollout_action(request, pk, rollout_id, rollouts.rollout_abort,
                           "Rollout aborted: every request goes back to the old generation.",
                           reason=request.POST.get("reason", ""))
