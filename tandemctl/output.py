"""Printing: `--output table` (people), `json` or `yaml` (scripts: the API's own objects)."""
import json
import sys

import yaml


def emit(data, fmt: str, *, table=None) -> None:
    """`data` as JSON or YAML; as a table, `table` (a list of rows, the first the header) or YAML when none."""
    if fmt == "json":
        print(json.dumps(data, indent=2, default=str))
    elif fmt == "yaml" or table is None:
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    else:
        print_table(table)


def print_table(rows: list[list]) -> None:
    rows = [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def note(message: str) -> None:
    """What people read beside the data (stderr, so `-o json` output stays parseable)."""
    print(message, file=sys.stderr)


def change_line(change: dict, *, created: bool = False) -> str:
    """One changed field as people read it: `  field: old → new (needs approval)`; of a new deployment, its
    value only (all of a new request waits for approval)."""
    if created:
        return f"  {change['field']}: {json.dumps(change['new'])}"
    line = f"  {change['field']}: {json.dumps(change['old'])} → {json.dumps(change['new'])}"
    return line + (" (needs approval)" if change["needs_approval"] else "")


def _usd(value) -> str:
    return "unknown" if value is None else f"${value:,.2f}/h"


def cost_line(preview: dict) -> str | None:
    """Cost per hour and GPUs against quota before → after, when either changes."""
    if (preview["hourly_usd_before"], preview["gpus_before"]) == (preview["hourly_usd_after"], preview["gpus_after"]):
        return None
    return (f"  cost: {_usd(preview['hourly_usd_before'])} → {_usd(preview['hourly_usd_after'])}, GPUs against quota: "
            f"{preview['gpus_before']} → {preview['gpus_after']}")
