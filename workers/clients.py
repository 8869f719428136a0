"""External clients (kubernetes, boto3, httpx), built in one place and injected into the target drivers.

Credentials come from a cluster's `secret_ref` (deployments.secret_refs) at the moment a client is built; they
stay inside the client object and are never logged, stored or put into an error message.
"""
import base64
import hashlib
import os
import tempfile

import boto3
import httpx
from botocore.config import Config as BotoConfig
from botocore.signers import RequestSigner
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from deployments.secret_refs import SecretRefError, secret_resolve
from deployments.yamlio import YAMLError, yaml_load
from workers.targets.base import PermanentError

HTTP_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# botocore's standard mode retries throttling and 5xx itself; what is left over reaches the driver's classifier.
BOTO_CONFIG = BotoConfig(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20)
EKS_TOKEN_TTL_SECONDS = 60  # EKS accepts a presigned token for 15 minutes after signing; 60 s is the norm
EKS_TOKEN_PREFIX = "k8s-aws-v1."


def _secret(ref: str, *, what: str) -> str:
    try:
        return secret_resolve(ref)
    except SecretRefError as e:
        raise PermanentError(f"Cannot read the {what} for this cluster: {e}") from None


def kubernetes_api_from_kubeconfig(*, secret_ref: str, context: str | None = None) -> k8s.ApiClient:
    """An ApiClient from a kubeconfig held behind the cluster's secret reference (its text, not a path)."""
    text = _secret(secret_ref, what="kubeconfig")
    try:
        data = yaml_load(text)
    except YAMLError:
        raise PermanentError("The cluster's kubeconfig is not valid YAML; register it again.") from None
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config_from_dict(data, context=context or None,
                                              client_configuration=configuration, persist_config=False)
    except (k8s_config.ConfigException, TypeError, KeyError) as e:
        raise PermanentError(f"The cluster's kubeconfig cannot be used: {e}") from None
    return _api_client(configuration)


def _api_client(configuration: k8s.Configuration) -> k8s.ApiClient:
    # No retries inside urllib3: it would sleep out a 429's Retry-After inside the worker. The reconciler
    # retries instead, with backoff, and records each transient error as an event.
    configuration.retries = False
    return k8s.ApiClient(configuration)


def kubernetes_api_from_token(*, host: str, token: str, ca_data: str | None = None) -> k8s.ApiClient:
    """An ApiClient for an API server reached with a bearer token (EKS), verifying its CA when given."""
    configuration = k8s.Configuration()
    configuration.host = host
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    if ca_data and host.startswith("https://"):
        configuration.ssl_ca_cert = ca_file(ca_data)
    return _api_client(configuration)


def ca_file(ca_data: str) -> str:
    """The path of a file holding a cluster's CA (public data; the client wants a file), one per CA: named by its
    digest and written once, so passes do not fill the worker's small /tmp with copies."""
    pem = base64.b64decode(ca_data)
    path = os.path.join(tempfile.gettempdir(), f"tandem-ca-{hashlib.sha256(pem).hexdigest()[:32]}.crt")
    if not os.path.exists(path):
        with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path), suffix=".tmp", delete=False) as f:
            f.write(pem)
        os.replace(f.name, path)  # atomic: a concurrent reader sees the whole file or none
    return path


def aws_session(*, region: str) -> boto3.session.Session:
    """A boto3 session from the worker's ambient AWS credentials (instance role, IRSA or environment)."""
    return boto3.session.Session(region_name=region)


def aws_assumed_session(session: boto3.session.Session, *, role_arn: str, region: str,
                        endpoint_url: str | None = None) -> boto3.session.Session:
    """A session on a role the worker assumes (STS AssumeRole) for one cluster's AWS calls."""
    sts = aws_client(session, "sts", endpoint_url=endpoint_url)
    creds = sts.assume_role(RoleArn=role_arn, RoleSessionName="tandem-worker")["Credentials"]
    return boto3.session.Session(aws_access_key_id=creds["AccessKeyId"],
                                 aws_secret_access_key=creds["SecretAccessKey"],
                                 aws_session_token=creds["SessionToken"], region_name=region)


def aws_client(session: boto3.session.Session, service: str, *, endpoint_url: str | None = None,
               attempts: int | None = None):
    """A boto3 client with Tandem's retry and timeout policy; `endpoint_url` points tests at moto; `attempts` for a
    caller that would rather hear a failure at once (the preflight) than have it retried."""
    config = BOTO_CONFIG if attempts is None else BOTO_CONFIG.merge(
        BotoConfig(retries={"mode": "standard", "max_attempts": attempts}))
    return session.client(service, endpoint_url=endpoint_url or None, config=config)


def eks_bearer_token(*, session: boto3.session.Session, cluster_name: str, region: str,
                     sts_endpoint_url: str | None = None) -> str:
    """An EKS bearer token: an STS GetCallerIdentity URL presigned with the x-k8s-aws-id header."""
    sts = aws_client(session, "sts", endpoint_url=sts_endpoint_url)
    signer = RequestSigner(sts.meta.service_model.service_id, region, "sts", "v4",
                           session.get_credentials(), session.events)
    base = sts_endpoint_url.rstrip("/") if sts_endpoint_url else f"https://sts.{region}.amazonaws.com"
    url = signer.generate_presigned_url(
        {"method": "GET", "url": f"{base}/?Action=GetCallerIdentity&Version=2011-06-15", "body": {},
         "headers": {"x-k8s-aws-id": cluster_name}, "context": {}},
        region_name=region, expires_in=EKS_TOKEN_TTL_SECONDS, operation_name="",
    )
    return EKS_TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def ray_dashboard_client(*, base_url: str, secret_ref: str) -> httpx.Client:
    """An httpx client for a Ray dashboard; Ray 2.60's token auth takes `Authorization: Bearer <token>`."""
    headers = {}
    token = _secret(secret_ref, what="Ray auth token") if secret_ref else ""
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=HTTP_TIMEOUT)


def http_client() -> httpx.Client:
    """A plain httpx client for unauthenticated probes (the Serve endpoint)."""
    return httpx.Client(timeout=httpx.Timeout(5.0, connect=3.0))
