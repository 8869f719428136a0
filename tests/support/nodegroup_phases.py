"""EKS managed node groups take minutes to create and to delete; moto makes them ACTIVE, and gone, at once. This
gives them the CREATING and DELETING phases of botocore's `NodegroupStatus`, stepped by the test, never by the
clock: each phase lasts `describes[status]` DescribeNodegroup answers (any caller's), or until `advance`.

While a phase lasts, EKS answers as it does (botocore's eks error shapes; the messages are the emulator's):
- CreateNodegroup of a name that exists in any status, DELETING included: ResourceInUseException (moto's own
  "NodeGroup already exists with name ..." answer, which the group kept in moto gives).
- UpdateNodegroupConfig of a group that is neither ACTIVE nor DEGRADED: ResourceInUseException while an operation
  is in progress (CREATING, UPDATING, DELETING), InvalidRequestException for a failed group. (A DEGRADED group can
  be resized: aws/containers-roadmap#2326 scales one to zero.)
- ListNodegroups lists a DELETING group (it counts against the quota until it is gone).
A CREATING group ends in the status its creation was headed for (ACTIVE, or CREATE_FAILED with EKS's health
issue: tests/support/eks_rules.py decides which), a DELETING one goes.
"""
from dataclasses import dataclass, field

from tests.support.eks_rules import _eks_backend, _eks_error

DEFAULT_DESCRIBES = {"CREATING": 1, "DELETING": 1}
RESIZABLE = ("ACTIVE", "DEGRADED")
IN_PROGRESS = ("CREATING", "UPDATING", "DELETING")


def _cluster(region: str, name: str):
    return _eks_backend(region).clusters.get(name)


@dataclass
class Phase:
    status: str  # CREATING or DELETING
    left: int  # DescribeNodegroup answers still to give in this status
    ends_in: str = "ACTIVE"  # what a CREATING group becomes
    health: dict = field(default_factory=lambda: {"issues": []})


class NodegroupPhases:
    """The phases of one server's node groups, keyed by (region, cluster, node group)."""

    def __init__(self):
        self.describes = dict(DEFAULT_DESCRIBES)
        self._phases: dict[tuple[str, str, str], Phase] = {}

    def reset(self) -> None:
        self.describes = dict(DEFAULT_DESCRIBES)
        self._phases.clear()

    def _group(self, key):
        cluster = _cluster(key[0], key[1])
        return cluster, (cluster.nodegroups.get(key[2]) if cluster else None)

    def _current(self, key):
        """The group and its phase, when it is still in it (a test may have set another status on moto's object)."""
        cluster, group = self._group(key)
        phase = self._phases.get(key)
        if phase is None or group is None or group.status != phase.status:
            self._phases.pop(key, None)
            return cluster, group, None
        return cluster, group, phase

    def creating(self, key, *, ends_in: str = "ACTIVE", issues: list[dict] | None = None) -> None:
        """A group moto has just made: CREATING, then `ends_in` with these health issues."""
        _, group = self._group(key)
        group.status = "CREATING"
        group.health = {"issues": []}
        self._phases[key] = Phase("CREATING", self.describes["CREATING"], ends_in, {"issues": issues or []})

    def _end(self, key) -> None:
        cluster, group, phase = self._current(key)
        if phase is None:
            return
        del self._phases[key]
        if phase.status == "CREATING":
            group.status, group.health = phase.ends_in, phase.health
        else:  # DELETING: gone
            cluster.nodegroups.pop(key[2], None)
            cluster.nodegroup_count -= 1

    def described(self, key) -> None:
        """A DescribeNodegroup is about to be answered: one step of the group's phase."""
        _, _, phase = self._current(key)
        if phase is None:
            return
        if phase.left > 0:
            phase.left -= 1
        else:
            self._end(key)

    def advance(self, key) -> None:
        """End the group's phase now, whatever is left of it."""
        self._end(key)

    def report(self, key, *, status: str, issues: list[dict]) -> None:
        """EKS reports the group in `status` with these health issues from now on (its phase, if any, is over)."""
        _, group = self._group(key)
        group.status, group.health = status, {"issues": issues}
        self._phases.pop(key, None)

    def update_refusal(self, key):
        """EKS's answer to UpdateNodegroupConfig of a group that cannot take one now; None otherwise."""
        _, group = self._group(key)
        if group is None or group.status in RESIZABLE:
            return None
        if group.status in IN_PROGRESS:
            return _eks_error(409, "ResourceInUseException",
                              f"Nodegroup {key[2]} is currently {group.status} and cannot be updated.")
        return _eks_error(400, "InvalidRequestException",
                          f"Nodegroup {key[2]} is {group.status}: it cannot be updated, only deleted.")

    def deleting(self, key):
        """Before moto answers DeleteNodegroup: the group reads DELETING (in the answer too). Returns what `deleted`
        needs to keep the group in moto until its phase ends."""
        cluster, group, phase = self._current(key)
        if group is None:
            return None  # moto answers ResourceNotFoundException
        group.status = "DELETING"
        if phase is None or phase.status != "DELETING":
            self._phases[key] = Phase("DELETING", self.describes["DELETING"])
        return cluster, group

    def deleted(self, key, kept) -> None:
        """After moto answered DeleteNodegroup (and dropped the group): it stays, DELETING, until its phase ends."""
        if kept is None:
            return
        cluster, group = kept
        if key[2] not in cluster.nodegroups:
            cluster.nodegroups[key[2]] = group
            cluster.nodegroup_count += 1
