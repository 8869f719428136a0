"""How nodeadm (the node agent of EKS's AL2023 AMIs) reads the NodeConfig parts of a node's user data, for the EKS
emulator: a user data nodeadm cannot read is a node that never joins the cluster.

Sources (awslabs/amazon-eks-ami at 81fec2e, 2026-07): `nodeadm/internal/configprovider/mime.go` (each MIME part of
type `application/node.eks.aws` is one document), `nodeadm/internal/api/bridge/decode.go` (apimachinery's
UniversalDecoder without strict mode: a field it does not know is dropped without a word, a value of the wrong type
fails the decoding, and the object must be `node.eks.aws/v1alpha1` `NodeConfig`, the one version registered),
the field types of `nodeadm/crds/node.eks.aws_nodeconfigs.yaml` (transcribed below as far as they go; the CRD's
descriptions are left out), and `nodeadm/internal/system/local_disk.go` with
`templates/al2023/runtime/bin/setup-local-disks` (the storage strategy, lowercased, must be raid0, raid10, mount or
none, else `nodeadm init` stops). Go's decoding is case-sensitive to the field names the types declare.
"""
import base64
import binascii
import email

import yaml

MEDIA_TYPE = "application/node.eks.aws"
API_VERSION, KIND = "node.eks.aws/v1alpha1", "NodeConfig"
DISK_STRATEGIES = ("raid0", "raid10", "mount", "none")

_STR, _BOOL, _BYTES, _ANY_OBJECT = {"type": "string"}, {"type": "boolean"}, {"type": "bytes"}, {"type": "object"}


def _obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


def _map(values: dict) -> dict:
    return {"type": "object", "additionalProperties": values}


def _list(items: dict) -> dict:
    return {"type": "array", "items": items}


NODE_CONFIG = _obj(
    apiVersion=_STR, kind=_STR, metadata=_ANY_OBJECT,
    spec=_obj(
        cluster=_obj(apiServerEndpoint=_STR, certificateAuthority=_BYTES, cidr=_STR, enableOutpost=_BOOL, id=_STR,
                     name=_STR),
        containerd=_obj(baseRuntimeSpec=_map(_ANY_OBJECT), config=_STR),
        featureGates=_map(_BOOL),
        instance=_obj(environment=_map(_map(_STR)),
                      localStorage=_obj(disabledMounts=_list(_STR), mountPath=_STR, strategy=_STR),
                      network=_obj(domains=_list(_STR), nameservers=_list(_STR))),
        kubelet=_obj(config=_map(_ANY_OBJECT), flags=_list(_STR), maxPodsExpression=_STR),
    ),
)


class NodeadmError(Exception):
    """What `nodeadm init` stops on: the node never joins."""


def _decode(value, schema: dict, path: str):
    """`value` as Go's JSON decoding into nodeadm's types leaves it: unknown fields dropped, a wrong type an error."""
    if value is None:  # null decodes to the zero value
        return None
    kind = schema["type"]
    if kind == "object":
        if not isinstance(value, dict):
            raise NodeadmError(f"cannot unmarshal {type(value).__name__} into {path} of type object")
        if "properties" in schema:
            return {k: _decode(v, schema["properties"][k], f"{path}.{k}")
                    for k, v in value.items() if k in schema["properties"]}
        if "additionalProperties" in schema:
            return {k: _decode(v, schema["additionalProperties"], f"{path}.{k}") for k, v in value.items()}
        return value
    if kind == "array":
        if not isinstance(value, list):
            raise NodeadmError(f"cannot unmarshal {type(value).__name__} into {path} of type array")
        return [_decode(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "boolean":
        if not isinstance(value, bool):
            raise NodeadmError(f"cannot unmarshal {type(value).__name__} into {path} of type bool")
        return value
    if not isinstance(value, str):  # string or bytes; YAML's 1 or true is not a Go string
        raise NodeadmError(f"cannot unmarshal {type(value).__name__} into {path} of type string")
    if kind == "bytes":
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            raise NodeadmError(f"illegal base64 data in {path}") from None
    return value


def node_config(document: str) -> dict:
    """One NodeConfig document as nodeadm applies it; NodeadmError where nodeadm stops."""
    try:
        raw = yaml.safe_load(document)
    except yaml.YAMLError as e:
        raise NodeadmError(f"failed to decode node config: {e}") from None
    if not isinstance(raw, dict) or raw.get("apiVersion") != API_VERSION or raw.get("kind") != KIND:
        got = f"{raw.get('apiVersion')} {raw.get('kind')}" if isinstance(raw, dict) else type(raw).__name__
        raise NodeadmError(f"failed to decode node config: no kind is registered for {got} (nodeadm knows "
                           f"{API_VERSION} {KIND})")
    config = _decode(raw, NODE_CONFIG, "NodeConfig")
    strategy = (((config.get("spec") or {}).get("instance") or {}).get("localStorage") or {}).get("strategy")
    if strategy and strategy.lower() not in DISK_STRATEGIES:
        raise NodeadmError(f"setup-local-disks {strategy.lower()}: Valid disk setup options are: raid0, raid10, "
                           "mount or none")
    return config


def node_configs(user_data_b64: str | bytes | None) -> list[dict]:
    """The NodeConfig parts of a launch template's (base64) user data, each as nodeadm applies it."""
    if not user_data_b64:
        return []
    message = email.message_from_bytes(base64.b64decode(user_data_b64))
    parts = message.get_payload() if message.is_multipart() else [message]
    return [node_config(part.get_payload(decode=True).decode()) for part in parts
            if part.get_content_type() == MEDIA_TYPE]
