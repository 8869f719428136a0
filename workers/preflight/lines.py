"""A preflight check's outcome: one line with pass, fail or unverified, what was seen, and the fix."""
from dataclasses import asdict, dataclass

PASS, FAIL, UNVERIFIED = "pass", "fail", "unverified"


@dataclass(frozen=True)
class CheckLine:
    """One check's outcome: `status` pass, fail or unverified; what was seen; what to do about a failure; what it is
    about."""

    name: str
    status: str
    evidence: str
    fix: str = ""
    # What the line is about (deployments.check_subjects): a failing line stops the approval of a deployment that
    # uses it; "" for the cluster as a whole.
    subject: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Unreadable(Exception):
    """A call the check needs was refused or failed: the check fails with this as its evidence."""
