"""The marker of a pending on-demand conformance run, one per deployment in Redis: set when a user asks for a run
(observability.services.conformance_requests), cleared by the run's task when the run ends, however it ends. A
module of its own so that the task and the service that queues it each import it, and not each other."""
from controlplane.redis_client import redis_client


def conformance_pending_key(deployment_id: int) -> str:
    return f"tandem:conformance:pending:{deployment_id}"


def conformance_request_done(*, deployment_id: int) -> None:
    """The on-demand run finished (or failed): the deployment may be checked again."""
    redis_client().delete(conformance_pending_key(deployment_id))
