"""IAM's policy evaluation for one principal's identity policies, and `iam:SimulatePrincipalPolicy` answered with it
in front of moto (which does not implement the simulator: its server answers 500).

Evaluation, as IAM documents it for a single account with identity policies only (IAM User Guide, "Policy evaluation
logic"): an explicit Deny of a matching statement wins, then any Allow, else the request is implicitly denied. A
statement matches when its Action and Resource match (IAM's `*` and `?` wildcards, case-sensitive for resources)
and every condition holds against the request context. Only the condition operators Tandem's policies use are
evaluated, with IAM's semantics for a key missing from the context (User Guide, "IAM JSON policy elements: Condition
operators"); any other operator, NotAction or NotResource raises, so a policy the emulator cannot judge fails the
test instead of passing it.

The answer has botocore's `SimulatePolicyResponse` shape (iam 2010-05-08), one `EvaluationResult` per action with
the most restrictive decision over the resources and each resource's own in `ResourceSpecificResults` (the IAM API
reference's EvaluationResult: "the simulator now returns a single EvaluationResult per action, regardless of how
many resource ARNs are provided").
"""
import fnmatch
import json
import uuid
from urllib.parse import unquote
from xml.sax.saxutils import escape

from moto.core import DEFAULT_ACCOUNT_ID

IAM_NS = "https://iam.amazonaws.com/doc/2010-05-08/"
DECISIONS = {"Allow": "allowed", "ExplicitDeny": "explicitDeny", "ImplicitDeny": "implicitDeny"}
RESTRICTIVE = ["explicitDeny", "implicitDeny", "allowed"]  # most restrictive first


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _condition_holds(operator: str, wanted: dict, context: dict) -> bool:
    """The condition operators Tandem's policies use, with IAM's documented semantics for a missing key."""
    for key, values in wanted.items():
        values = _listed(values)
        given = context.get(key)
        if operator == "Null":
            holds = (given is None) == (values == ["true"])
        elif operator == "StringEquals":
            holds = given is not None and any(g in values for g in _listed(given))
        elif operator == "StringLike":
            holds = given is not None and any(fnmatch.fnmatchcase(g, v) for g in _listed(given) for v in values)
        elif operator == "ForAnyValue:StringEquals":
            holds = given is not None and any(g in values for g in _listed(given))
        else:
            raise AssertionError(f"the emulated IAM does not evaluate {operator}: add it with IAM's semantics")
        if not holds:
            return False
    return True


def iam_decision(statements: list[dict], action: str, resource: str, context: dict) -> str:
    """"Allow", "ExplicitDeny" or "ImplicitDeny" for one request under these identity policy statements."""
    decision = "ImplicitDeny"
    for s in statements:
        if "NotAction" in s or "NotResource" in s:
            raise AssertionError("the emulated IAM does not evaluate NotAction or NotResource")
        if not any(fnmatch.fnmatch(action.lower(), a.lower()) for a in _listed(s["Action"])):
            continue  # actions are case-insensitive
        if not any(fnmatch.fnmatchcase(resource, r) for r in _listed(s["Resource"])):
            continue
        if all(_condition_holds(op, wanted, context) for op, wanted in s.get("Condition", {}).items()):
            if s["Effect"] == "Deny":
                return "ExplicitDeny"
            decision = "Allow"
    return decision


def principal_statements(arn: str) -> list[dict] | None:
    """The statements of every identity policy (inline and attached) of the role or user `arn` in moto's IAM; None
    when moto has no such principal (IAM answers NoSuchEntity)."""
    from moto.iam.models import iam_backends

    backend = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    kind, _, name = arn.split(":", 5)[5].partition("/")
    name = name.rsplit("/", 1)[-1]
    try:
        principal = backend.get_role(name) if kind == "role" else backend.get_user(name)
    except Exception:
        return None
    documents = list(principal.policies.values()) + [
        next(v.document for v in p.versions if v.is_default) for p in principal.managed_policies.values()]
    statements = []
    for document in documents:
        parsed = json.loads(unquote(document) if isinstance(document, str) else json.dumps(document))
        statements += _listed(parsed["Statement"])
    return statements


def _members(params: dict, name: str) -> list[str]:
    found, n = [], 1
    while f"{name}.member.{n}" in params:
        found.append(params[f"{name}.member.{n}"][0])
        n += 1
    return found


def _context(params: dict) -> dict:
    context, n = {}, 1
    while f"ContextEntries.member.{n}.ContextKeyName" in params:
        key = params[f"ContextEntries.member.{n}.ContextKeyName"][0]
        values = _members(params, f"ContextEntries.member.{n}.ContextKeyValues")
        kind = params.get(f"ContextEntries.member.{n}.ContextKeyType", ["string"])[0]
        context[key] = values if kind.endswith("List") else values[0]
        n += 1
    return context


def simulate_principal_policy(params: dict):
    """(status, headers, body) for iam:SimulatePrincipalPolicy with these query parameters."""
    source = params.get("PolicySourceArn", [""])[0]
    statements = principal_statements(source)
    if statements is None:
        body = (f'<ErrorResponse xmlns="{IAM_NS}"><Error><Type>Sender</Type><Code>NoSuchEntity</Code><Message>'
                f"{escape(source)} not found</Message></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>")
        return 404, [("Content-Type", "text/xml")], body.encode()
    resources = _members(params, "ResourceArns") or ["*"]
    context = _context(params)
    results = []
    for action in _members(params, "ActionNames"):
        each = [(r, DECISIONS[iam_decision(statements, action, r, context)]) for r in resources]
        overall = min((d for _, d in each), key=RESTRICTIVE.index)
        specific = "".join(f"<member><EvalResourceName>{escape(r)}</EvalResourceName><EvalResourceDecision>{d}"
                           f"</EvalResourceDecision><MatchedStatements/><MissingContextValues/></member>"
                           for r, d in each)
        results.append(f"<member><EvalActionName>{escape(action)}</EvalActionName><EvalResourceName>"
                       f"{escape(resources[0])}</EvalResourceName><EvalDecision>{overall}</EvalDecision>"
                       f"<MatchedStatements/><MissingContextValues/><ResourceSpecificResults>{specific}"
                       f"</ResourceSpecificResults></member>")
    body = (f'<SimulatePrincipalPolicyResponse xmlns="{IAM_NS}"><SimulatePrincipalPolicyResult><IsTruncated>false'
            f"</IsTruncated><EvaluationResults>{''.join(results)}</EvaluationResults></SimulatePrincipalPolicyResult>"
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
            "</SimulatePrincipalPolicyResponse>")
    return 200, [("Content-Type", "text/xml")], body.encode()
