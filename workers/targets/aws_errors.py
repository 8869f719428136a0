"""How a failed AWS call reads to the reconciler: transient (throttling, 5xx, the network: retried with backoff) or
permanent (denied, invalid: the user is told), in one place for every caller of boto3 in the eks driver."""
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError

from workers.targets.base import PermanentError, TransientError

THROTTLING = {"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
              "ServiceUnavailableException", "ServerException", "InternalFailure"}
DENIED = {"AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
          "InvalidClientTokenId", "ExpiredTokenException"}


def error_code(e: ClientError) -> str:
    """The AWS error code of a failed call ("InvalidGroup.NotFound", ...)."""
    return e.response.get("Error", {}).get("Code", "")


def aws_error(e: Exception, *, doing: str) -> Exception:
    """Classify a boto3 failure as transient (throttling, 5xx, network) or permanent (denied, invalid)."""
    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        message = e.response.get("Error", {}).get("Message", "")
        if code in THROTTLING or status == 429 or status >= 500:
            return TransientError(f"AWS is throttling or unavailable while {doing} ({code}); retrying.")
        if code in DENIED:
            return PermanentError(f"AWS refused the worker's credentials while {doing} ({code}): give the "
                                  "worker's role deploy/iam/eks-driver-policy.json.")
        return PermanentError(f"AWS rejected {doing}: {code}: {message}")
    if isinstance(e, (BotoConnectionError, BotoCoreError)):
        return TransientError(f"Cannot reach AWS while {doing}: {type(e).__name__}; retrying.")
    return e
