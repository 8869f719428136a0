"""Fixture loading for the observability tests."""
import re
from pathlib import Path

from deployments.serve_config import serve_app_name

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def as_application_of(text: str, d) -> str:
    """A fixture scrape (its Serve application was `default`) as deployment `d`'s application would export it."""
    app = serve_app_name(deployment_id=d.pk, name=d.name, target_kind=d.cluster.kind)
    return text.replace('application="default"', f'application="{app}"')


def set_value(text: str, sample_prefix: str, value: float, where: str = "") -> str:
    """Set every sample line starting with `sample_prefix` (and containing `where`) to `value`."""
    out = []
    for line in text.splitlines():
        if line.startswith(sample_prefix) and where in line:
            line = re.sub(r" [0-9.e+-]+$", f" {value}", line)
        out.append(line)
    return "\n".join(out) + "\n"
