"""Kubernetes' scheduling rules the device-plugin checks apply: does a pod tolerate a node's taints, does its
node affinity admit the node's labels (k8s.io/api/core/v1 Toleration.ToleratesTaint, NodeSelectorRequirement)."""


def taint_tolerated(taint: dict, tolerations: list[dict]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key"):
            if operator == "Exists":
                return True
            continue
        if t["key"] != taint["key"]:
            continue
        if operator == "Exists" or (operator == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def _expression_matches(expr: dict, labels: dict) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_admits(pod_spec: dict, labels: dict) -> bool:
    """Whether a pod's nodeSelector and required node affinity admit a node with these labels (terms are ORed,
    the expressions in a term ANDed)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or []) for term in terms)


def affinity_text(pod_spec: dict) -> str:
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [" and ".join(f"{e.get('key')} {e.get('operator')} {','.join(e.get('values') or [])}".strip()
                          for e in term.get("matchExpressions") or [])
             for term in required.get("nodeSelectorTerms") or []]
    selector = [f"{k}={v}" for k, v in (pod_spec.get("nodeSelector") or {}).items()]
    return " or ".join(f"({t})" for t in terms) + (f" nodeSelector {', '.join(selector)}" if selector else "")


def kube_taints(eks_taints: list[dict]) -> list[dict]:
    """EKS's NO_SCHEDULE form as the node carries it (NoSchedule)."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    return [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]} for t in eks_taints]


def taint_text(taint: dict) -> str:
    return f"{taint['key']}={taint.get('value', '')}:{taint['effect']}"
