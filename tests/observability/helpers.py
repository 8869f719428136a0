"""Fixture loading for the observability tests."""
import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def set_value(text: str, sample_prefix: str, value: float, where: str = "") -> str:
    """Set every sample line starting with `sample_prefix` (and containing `where`) to `value`."""
    out = []
    for line in text.splitlines():
        if line.startswith(sample_prefix) and where in line:
            line = re.sub(r" [0-9.e+-]+$", f" {value}", line)
        out.append(line)
    return "\n".join(out) + "\n"
