"""tandemctl's commands. Each is a few API calls (tandemctl.client.OPERATIONS) and an exit code
(tandemctl.errors) a pipeline can branch on."""
import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from tandemctl import errors
from tandemctl.client import Client
from tandemctl.config import settings_load
from tandemctl.errors import CliError
from tandemctl.manifest import manifests_load
from tandemctl.output import change_line, cost_line, emit, note
from tandemctl.rollouts import ACTIONS, rollout_act, rollout_latest, rollout_print
from tandemctl.spec_schema import SpecSchema

PENDING = "pending_approval"


def _split(ref: str, team: str | None) -> tuple[str, str]:
    """"team/name", or a name with --team."""
    if "/" in ref:
        team, _, name = ref.partition("/")
    else:
        name = ref
    if not team:
        raise CliError(f"Which team's {ref!r}? Write TEAM/NAME or pass --team.", errors.USAGE)
    return team, name


def _find(api: Client, team: str, name: str) -> dict | None:
    """The team's live deployment of this name (at most one exists)."""
    found = api.call("deployments.list", params={"team": team, "name": name, "live": "true"})["results"]
    return found[0] if found else None


def _get(api: Client, ref: str, team: str | None) -> dict:
    team, name = _split(ref, team)
    if (d := _find(api, team, name)) is None:
        raise CliError(f"No live deployment {team}/{name} that you can see.", errors.NOT_FOUND)
    return d


def _waits(d: dict) -> bool:
    return d["status"] == PENDING or d.get("proposed_spec_hash") is not None


def _row(d: dict) -> list:
    return [d["team"], d["name"], d["cluster"], d["status"], d["generation"], d["model"],
            (d.get("endpoint") or {}).get("base_url", "")]


HEADER = ["TEAM", "NAME", "CLUSTER", "STATUS", "GEN", "MODEL", "ENDPOINT"]


# What the server's dry run says applying a manifest would do (its `outcome`), as the preview's first line.
WOULD = {
    "created": "would be created: a request that waits for approval",
    "edited": "would be edited: the request still waits for approval",
    "updated": "would be updated at once (nothing in it needs approval)",
    "proposed": "would get a proposed update that waits for approval; the approved spec keeps running",
}


def _create_body(m) -> dict:
    return {"team": m.team, "cluster": m.cluster, "name": m.name, "spec": m.spec} | (
        {} if m.purpose is None else {"purpose": m.purpose})


def _update_body(m) -> dict:
    return {"spec": m.spec} | ({} if m.purpose is None else {"purpose": m.purpose})


def _preview(api: Client, m) -> tuple[dict | None, dict]:
    """The team's live deployment the manifest names (None: there is none yet) and what applying the manifest
    would do: the server's dry run of the create or update apply sends, under the same rules."""
    current = _find(api, m.team, m.name)
    if current is None:
        return None, api.call("deployments.preview_create", body=_create_body(m))
    if current["cluster"] != m.cluster:
        raise CliError(f"{m.source}: {m.ref} runs on cluster {current['cluster']}; a deployment does not "
                       f"move to {m.cluster}. Delete it first, or name the new one differently.", errors.INVALID)
    return current, api.call("deployments.preview_update", body=_update_body(m), id=current["id"])


def _preview_lines(m, preview: dict) -> list[str]:
    if preview["outcome"] == "unchanged":
        return [f"deployment {m.ref} unchanged ({preview['status']}, generation {preview['generation']})"]
    created = preview["outcome"] == "created"
    lines = [f"deployment {m.ref} {WOULD[preview['outcome']]}"]
    lines += [change_line(c, created=created) for c in preview["changes"]]
    return lines + list(filter(None, [cost_line(preview)]))


def cmd_diff(api: Client, args) -> int:
    """What apply would do to each manifest's deployment, field by field (also `apply --dry-run`); writes nothing.
    Exit CHANGES when applying would change anything."""
    found = []
    for m in manifests_load(args.file):
        current, preview = _preview(api, m)
        found.append({"deployment": m.ref, "id": current["id"] if current else None} | preview)
        if args.output == "table":
            print("\n".join(_preview_lines(m, preview)))
    if args.output != "table":
        emit(found, args.output)
    return errors.CHANGES if any(p["outcome"] != "unchanged" for p in found) else errors.OK


def cmd_validate(api: Client, args) -> int:
    """Check each manifest's spec against the schema the server serves, writing nothing (for CI): every problem
    as `FILE: spec.PATH: why`. Exit INVALID when a manifest is not valid."""
    schema = SpecSchema(api.schema())
    found = [{"manifest": m.source, "deployment": m.ref, "problems": schema.problems(m.spec)}
             for m in manifests_load(args.file)]
    if args.output != "table":
        emit(found, args.output)
    else:
        for f in found:
            for problem in f["problems"]:
                print(f"{f['manifest']}: {problem}")
    bad = sum(bool(f["problems"]) for f in found)
    note(f"{len(found) - bad} of {len(found)} manifest(s) valid" + (f"; {bad} not" if bad else ""))
    return errors.INVALID if bad else errors.OK


def cmd_apply(api: Client, args) -> int:
    """Create or update each manifest's deployment, each preceded by its preview (the server's dry run);
    unchanged ones are left alone and said so. --dry-run stops after the previews."""
    if args.dry_run:
        cmd_diff(api, args)
        return errors.OK
    results, code = [], errors.OK
    for m in manifests_load(args.file):
        current, preview = _preview(api, m)
        if preview["outcome"] == "unchanged":
            d, action = current, "unchanged"
        else:
            if args.output == "table":
                print("\n".join(_preview_lines(m, preview)))
            if current is None:
                d, action = api.call("deployments.create", body=_create_body(m)), "created"
            else:
                d = api.call("deployments.update", body=_update_body(m), id=current["id"])
                same = all(d[k] == current[k] for k in ("generation", "proposed_spec_hash", "purpose", "spec"))
                action = "unchanged" if same else ("update proposed" if d["proposed_spec_hash"] else "updated")
        if action != "unchanged" and _waits(d):
            code = errors.PENDING_APPROVAL
        changes = [change_line(c, created=action == "created") for c in preview["changes"]]
        results.append({"deployment": m.ref, "id": d["id"], "action": action, "status": d["status"],
                        "generation": d["generation"], "changes": changes, "preview": preview})
        if args.output == "table":
            print(f"deployment {m.ref} {action} ({d['status']}, generation {d['generation']})")
            if action != "unchanged" and _waits(d):
                print(f"  waiting for approval: tandemctl approve {m.ref}")
    if args.output != "table":
        emit(results, args.output)
    return code


def cmd_get(api: Client, args) -> int:
    if args.name:
        d = _get(api, args.name, args.team)
        emit(d, args.output, table=[HEADER, _row(d)])
        return errors.OK
    items = api.every("deployments.list", params={"team": args.team, "live": None if args.all else "true"})
    emit(items, args.output, table=[HEADER] + [_row(d) for d in items])
    return errors.OK


def cmd_describe(api: Client, args) -> int:
    d = _get(api, args.name, args.team)
    events = list(reversed(api.call("deployments.events", id=d["id"], params={"limit": 20})["results"]))
    if args.output != "table":
        emit({"deployment": d, "events": events}, args.output)
        return errors.OK
    print(f"Deployment:  {d['team']}/{d['name']} (id {d['id']}) on {d['cluster']}")
    print(f"Status:      {d['status']}" + (f" — {d['status_reason']}" if d.get("status_reason") else ""))
    print(f"Generation:  {d['generation']} (observed {d['observed_generation']})")
    print(f"Model:       {d['model']}")
    endpoint = d.get("endpoint")
    print(f"Endpoint:    {endpoint['base_url']} model={endpoint['model']}" if endpoint else "Endpoint:    (none yet)")
    if d.get("proposal"):
        print("Proposed update (waiting for approval):")
        for c in d["proposal"]["changes"]:
            print(change_line(c))
    conditions = d.get("conditions") or []
    print("Conditions:")
    emit(None, "table", table=[["TYPE", "STATUS", "REASON", "MESSAGE"]] + [
        [c.get("type"), c.get("status"), c.get("reason"), _first_line(c.get("message"))] for c in conditions])
    serve = next((c for c in conditions if c.get("type") == "ServeRunning"), {})
    if serve.get("status") == "False" and serve.get("reason") != "Paused" and serve.get("message"):
        print("Why it does not serve:")  # what the cluster reports wrong, a stage's cause on each line
        for line in serve["message"].splitlines():
            print(f"  {line}")
    print("Timeline:")
    emit(None, "table", table=[["TIME", "KIND", "ACTOR", "MESSAGE"]] + [
        [e["created_at"], e["kind"], e["actor"] or "tandem", e["message"]] for e in events])
    return errors.OK


def _first_line(text: str | None) -> str:
    """A message in a table cell: its first line, marked when more follow (shown in full below it)."""
    lines = (text or "").splitlines() or [""]
    return lines[0] + (" (…)" if len(lines) > 1 else "")


def cmd_wait(api: Client, args) -> int:
    """Poll until the deployment reaches --for; `failed` on the way stops it (exit 1), time running out exit 6."""
    team, name = _split(args.name, args.team)
    deadline = time.monotonic() + args.timeout
    while True:
        d = _find(api, team, name)
        status = d["status"] if d else "deleted"
        if status == args.condition:
            note(f"deployment {team}/{name} is {status}")
            return errors.OK
        if status == "failed":
            raise CliError(f"deployment {team}/{name} failed: {d.get('status_reason') or 'see describe'}",
                           errors.FAILED)
        if d is None:
            raise CliError(f"No live deployment {team}/{name}.", errors.NOT_FOUND)
        if time.monotonic() >= deadline:
            raise CliError(f"Timed out after {args.timeout:g} s: deployment {team}/{name} is {status}, not "
                           f"{args.condition}.", errors.TIMED_OUT)
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))


def _decide(api: Client, args, operation: str) -> int:
    d = _get(api, args.name, args.team)
    if operation == "deployments.approve" and (failures := d.get("cluster_check_failures")):
        note(f"cluster {d['cluster']} fails {len(failures)} of its checks (tandemctl doctor {d['cluster']}):")
        for f in failures:
            note(f"  {f['name']}: {f['evidence']}" + (f" fix: {f['fix']}" if f["fix"] else ""))
    body = {"generation": d["generation"], "proposed_spec_hash": d.get("proposed_spec_hash"),
            "comment": args.comment or ""}
    d = api.call(operation, body=body, id=d["id"])
    emit(d, args.output, table=[HEADER, _row(d)])
    return errors.OK


def cmd_approve(api: Client, args) -> int:
    return _decide(api, args, "deployments.approve")


def cmd_reject(api: Client, args) -> int:
    return _decide(api, args, "deployments.reject")


def _act(api: Client, args, operation: str) -> int:
    """One action on a deployment by team and name; prints it as the server answered."""
    d = _get(api, args.name, args.team)
    d = api.call(operation, id=d["id"])
    emit(d, args.output, table=[HEADER, _row(d)])
    return errors.OK


def cmd_delete(api: Client, args) -> int:
    return _act(api, args, "deployments.delete")


def cmd_pause(api: Client, args) -> int:
    return _act(api, args, "deployments.pause")


def cmd_resume(api: Client, args) -> int:
    return _act(api, args, "deployments.resume")


def cmd_rollout(api: Client, args) -> int:
    """The update rolling out (else the last one), each step with its state; --pause, --resume or --abort REASON
    change it (team admins)."""
    d = _get(api, args.name, args.team)
    action = next((a for a in ACTIONS if getattr(args, a) not in (None, False)), None)
    if action is None:
        rollout_print(rollout_latest(api, d), args.output)
        return errors.OK
    r = rollout_act(api, d, action, reason=args.abort or "")
    note(f"rollout {r['id']} of {d['team']}/{d['name']} {ACTIONS[action][1]}")
    rollout_print(r, args.output)
    return errors.OK


def cmd_events(api: Client, args) -> int:
    d = _get(api, args.name, args.team)
    events = list(reversed(api.call("deployments.events", id=d["id"], params={"limit": args.limit})["results"]))
    emit(events, args.output, table=[["TIME", "KIND", "ACTOR", "MESSAGE"]] + [
        [e["created_at"], e["kind"], e["actor"] or "tandem", e["message"]] for e in events])
    return errors.OK


def _model_config(path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        facts = yaml.safe_load(Path(path).read_text())  # JSON is YAML
    except (OSError, yaml.YAMLError) as e:
        raise CliError(f"{path}: {e}", errors.USAGE) from None
    if not isinstance(facts, dict):
        raise CliError(f"{path}: a model's config.json is a mapping.", errors.USAGE)
    return facts


def cmd_plan(api: Client, args) -> int:
    facts = _model_config(args.model_config)
    plans = [{"deployment": m.ref, "plan": api.call("plans.create", body={
        "spec": m.spec, "team": m.team, "cluster": m.cluster, "model_facts": facts})}
             for m in manifests_load(args.file)]
    emit(plans, "yaml" if args.output == "table" else args.output)
    return errors.OK


KEY_HEADER = ["ID", "TEAM", "NAME", "OWNER", "KEY_ID", "LAST4", "DEPLOYMENTS", "EXPIRES"]


def _key_row(k: dict) -> list:
    return [k["id"], k["team"], k["name"], k["owner"] or "team", k["key_id"], k["last4"],
            "all" if k["all_deployments"] else ",".join(map(str, k["deployments"])), k["expires_at"]]


def cmd_keys_create(api: Client, args) -> int:
    body = {"team": args.team, "name": args.name, "all_deployments": not args.deployment,
            "team_key": args.team_key}
    if args.deployment:
        body["deployments"] = [_get(api, ref, args.team)["id"] for ref in args.deployment]
    if args.expires_at:
        body["expires_at"] = args.expires_at
    key = api.call("keys.create", body=body)
    if args.output == "table":
        print(f"API key {key['name']} ({key['key_id']}) of team {key['team']}. The secret is shown once; store it "
              "now:")
        print(key["secret"])
    else:
        emit(key, args.output)
    return errors.OK


def cmd_keys_list(api: Client, args) -> int:
    keys = api.every("keys.list", params={"team": args.team})
    emit(keys, args.output, table=[KEY_HEADER] + [_key_row(k) for k in keys])
    return errors.OK


def cmd_keys_revoke(api: Client, args) -> int:
    api.call("keys.revoke", id=args.id)
    note(f"API key {args.id} revoked")
    return errors.OK


def cmd_keys_transfer(api: Client, args) -> int:
    key = api.call("keys.transfer", id=args.id, body={"message": args.message})
    note(f"API key {key['name']} ({key['key_id']}) is now a key of team {key['team']}: it stays when its owner "
         "leaves")
    return errors.OK


DOCTOR_MARK = {"pass": "PASS", "fail": "FAIL", "unverified": "????"}


def cmd_doctor(api: Client, args) -> int:
    """Run a cluster's preflight and print each check: pass or fail, the evidence, and for a failure the fix.
    Exit 1 when a check failed, 6 when the run did not finish in --timeout."""
    run = api.call("clusters.check", name=args.cluster)
    deadline = time.monotonic() + args.timeout
    while run["status"] == "running":
        if time.monotonic() >= deadline:
            raise CliError(f"Timed out after {args.timeout:g} s: the checks of {args.cluster} are still running "
                           "(is a worker up?).", errors.TIMED_OUT)
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))
        run = api.call("clusters.check_read", name=args.cluster)
    if args.output != "table":
        emit(run, args.output)
    else:
        for line in run["lines"]:
            print(f"{DOCTOR_MARK[line['status']]}  {line['name']}: {line['evidence']}")
            if line["status"] != "pass" and line["fix"]:
                print(f"      fix: {line['fix']}")
        failed = sum(line["status"] == "fail" for line in run["lines"])
        print(f"{args.cluster}: {len(run['lines']) - failed} of {len(run['lines'])} checks did not fail"
              + (f"; {failed} failed" if failed else "") + (f"; {run['error']}" if run["error"] else "") + ".")
    return errors.FAILED if run["status"] in ("failed", "error") else errors.OK


def _setting(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value as JSON where it is JSON (a list, a number, an object), else as the text itself."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise CliError(f"Give each setting as KEY=VALUE, e.g. 'subnet_ids=[\"subnet-0abc...\"]'; got {text!r}.",
                       errors.USAGE)
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def cmd_cluster_set(api: Client, args) -> int:
    """Change settings of a registered cluster's config (platform admins): the rest of its config stays. The
    server checks the result as at registration and runs the cluster's checks again."""
    changes = dict(_setting(s) for s in args.settings)
    cluster = api.call("clusters.read", name=args.cluster)
    config = {k: v for k, v in {**(cluster.get("config") or {}), **changes}.items() if k not in args.unset}
    body = {"config": config} if "config" in cluster else {}  # a member sees no config; the PATCH answers 403
    if args.secret_ref is not None:
        body["secret_ref"] = args.secret_ref
    updated = api.call("clusters.update", name=args.cluster, body=body)
    if args.output != "table":
        emit(updated, args.output)
    elif updated.get("config") == cluster.get("config") and args.secret_ref is None:
        note(f"cluster {args.cluster}: nothing changed")
    else:
        note(f"cluster {args.cluster} updated; its checks run again: tandemctl doctor {args.cluster}")
    return errors.OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandemctl", description="Drive Tandem from a terminal or a pipeline.",
                                epilog="Exit codes: 0 done, 1 failed, 2 usage, 3 auth, 4 invalid, 5 waiting for "
                                       "approval, 6 timed out, 7 not found, 8 conflict, 9 schema drift, 10 diff: "
                                       "something would change.")
    # --server and --output go before or after the command; given after it, they win.
    for parser_, default in ((p, None), (common := argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)):
        parser_.add_argument("--server", default=default,
                             help="Tandem's URL (default: $TANDEM_URL, the config file, http://127.0.0.1:8800)")
        parser_.add_argument("-o", "--output", choices=["table", "json", "yaml"],
                             default="table" if default is None else default)
    p.set_defaults(needs_token=True)  # every command but validate acts as someone
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, func, help_, *, aliases=(), ref=True):
        c = sub.add_parser(name, help=help_, aliases=list(aliases), parents=[common])
        c.set_defaults(func=func)
        if ref:
            c.add_argument("name", help="TEAM/NAME, or NAME with --team")
            c.add_argument("--team")
        return c

    c = command("apply", cmd_apply, "create or update deployments from a manifest file or directory, each after "
                "its preview", ref=False)
    c.add_argument("-f", "--file", required=True)
    c.add_argument("--dry-run", action="store_true",
                   help="print what apply would do (the server's dry run) and change nothing; exit 0")
    c = command("diff", cmd_diff, "what apply would do: each changed field old → new and whether it needs "
                "approval; exit 0 when nothing would change, 10 when something would", ref=False)
    c.add_argument("-f", "--file", required=True)
    c = command("validate", cmd_validate, "check manifests against the server's schema without writing anything "
                "(for CI; no token needed: the schema is public); exit 4 when one is not valid", ref=False)
    c.add_argument("-f", "--file", required=True)
    c.set_defaults(needs_token=False)
    c = command("plan", cmd_plan, "the capacity plan of a manifest's spec, without a request", ref=False)
    c.add_argument("-f", "--file", required=True)
    c.add_argument("--model-config", help="the model's config.json, where the cluster cannot read its source")
    c = command("get", cmd_get, "list deployments, or show one", ref=False)
    c.add_argument("name", nargs="?", help="TEAM/NAME, or NAME with --team")
    c.add_argument("--team")
    c.add_argument("--all", action="store_true", help="also deleted, withdrawn and rejected ones")
    command("describe", cmd_describe, "status, conditions, timeline and endpoint of a deployment")
    c = command("wait", cmd_wait, "wait for a deployment to reach a status")
    c.add_argument("--for", dest="condition", default="running", help="a status (default running)")
    c.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    c.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    for name, func in (("approve", cmd_approve), ("reject", cmd_reject)):
        c = command(name, func, f"{name} what waits for a decision (the generation you see now)")
        c.add_argument("--comment", default="")
    command("delete", cmd_delete, "tear a deployment down (a pending request is withdrawn)")
    command("pause", cmd_pause, "free a deployment's serving part and quota (also while it provisions); keys, name and history stay")
    command("resume", cmd_resume, "bring a paused deployment back (no approval, but past the team's budget only a platform admin may)")
    c = command("rollout", cmd_rollout, "the update rolling out (else the last one), step by step; team admins "
                "pause, resume or abort it")
    act = c.add_mutually_exclusive_group()
    act.add_argument("--pause", action="store_true", help="hold it at its step: traffic stays split as it is")
    act.add_argument("--resume", action="store_true", help="go on from the step it was held at")
    act.add_argument("--abort", metavar="REASON",
                     help="move every request back to the old generation and remove the new one")
    c = command("events", cmd_events, "a deployment's audit trail, oldest first", aliases=("logs",))
    c.add_argument("--limit", type=int, default=50)

    c = command("doctor", cmd_doctor, "check that a cluster has what a deployment needs (platform admins): each "
                "check with its evidence and fix; exit 1 when one fails", ref=False)
    c.add_argument("cluster", help="the registered cluster's name")
    c.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the checks (default 300)")
    c.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)

    clusters = sub.add_parser("cluster", help="registered clusters (platform admins)").add_subparsers(
        dest="cluster_command", required=True)
    c = clusters.add_parser("set", help="change settings of a cluster's config (KEY=VALUE, the value as JSON where "
                            "it is JSON); the rest stays, and its checks run again", parents=[common])
    c.set_defaults(func=cmd_cluster_set)
    c.add_argument("cluster", help="the registered cluster's name")
    c.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    c.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove a setting (repeatable)")
    c.add_argument("--secret-ref", help="a new secret reference (env:... or file:...); empty for none")

    keys = sub.add_parser("keys", help="API keys for the OpenAI-compatible gateway").add_subparsers(
        dest="keys_command", required=True)
    c = keys.add_parser("create", help="create a key; its secret is printed once", parents=[common])
    c.set_defaults(func=cmd_keys_create)
    c.add_argument("--team", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--deployment", action="append", help="limit the key to this deployment (repeatable)")
    c.add_argument("--expires-at", help="ISO 8601; default: the team's default lifetime")
    c.add_argument("--team-key", action="store_true",
                   help="owned by the team, not by you: it stays when people leave (team admins)")
    c = keys.add_parser("list", help="the team's live keys", parents=[common])
    c.set_defaults(func=cmd_keys_list)
    c.add_argument("--team")
    c = keys.add_parser("revoke", help="revoke a key by id", parents=[common])
    c.set_defaults(func=cmd_keys_revoke)
    c.add_argument("id", type=int)
    c = keys.add_parser("transfer", help="make a person's key a team key, so it stays when they leave (team admins)",
                        parents=[common])
    c.set_defaults(func=cmd_keys_transfer)
    c.add_argument("id", type=int)
    c.add_argument("--message", default="", help="why, for the audit trail")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_load(server=args.server, token_required=args.needs_token)
        return args.func(Client(server=settings.server, token=settings.token), args)
    except CliError as e:
        print(f"tandemctl: {e.message}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
