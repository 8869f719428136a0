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


def flatten(value, prefix: str = "") -> dict:
    """{"a": {"b": 1}} → {"a.b": 1}: the fields a diff compares."""
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def diff_lines(before: dict, after: dict) -> list[str]:
    """One line per changed field: `  field: old → new`."""
    old, new = flatten(before or {}), flatten(after or {})
    return [f"  {k}: {json.dumps(old.get(k))} → {json.dumps(new.get(k))}"
            for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
