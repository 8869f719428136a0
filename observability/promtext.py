"""Prometheus samples from the text exposition format (Ray's metrics export) or a Prometheus HTTP API answer."""
import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str  # the sample's own name, suffix included (`..._bucket`, `..._sum`, `..._total`)
    labels: dict
    value: float


def parse_text(text: str) -> list[Sample]:
    """Every sample of a text exposition, in order; NaN samples are dropped (they carry no count)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not math.isnan(s.value):
                out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


def parse_prometheus_api(body: dict) -> list[Sample]:
    """Samples from a `/api/v1/query` answer whose result is an instant vector."""
    if body.get("status") != "success" or body.get("data", {}).get("resultType") != "vector":
        raise ValueError(f"Not an instant-vector answer: status={body.get('status')!r}, "
                         f"error={body.get('error')!r}")
    out = []
    for row in body["data"]["result"]:
        labels = dict(row["metric"])
        name = labels.pop("__name__", "")
        value = float(row["value"][1])
        if name and not math.isnan(value):
            out.append(Sample(name, labels, value))
    return out
