"""python-scim's conformance checker (scim2-tester) against a live Tandem: discovery, then creation, query,
replacement and deletion of generated users and groups.

Its PATCH checks (patch:add, patch:replace, patch:remove) are left out: they set every attribute of the User and
Group schemas (x509Certificates, ims, a second e-mail, ...) and expect each back, while Tandem keeps only what it
uses (userName, externalId, name.givenName and familyName, one e-mail, active, group members). The PATCH requests
identity providers send are tested as recorded (test_okta.py, test_entra.py, test_bad_input.py)."""
from collections import Counter

from scim2_tester import Status, check_server


def test_scim2_tester_finds_no_error(scim):
    results = check_server(scim, exclude_tags={"patch:add", "patch:replace", "patch:remove"})
    errors = [(r.title, r.reason) for r in results if r.status == Status.ERROR]
    assert errors == [], "\n".join(f"{t}: {r}" for t, r in errors)
    # It ran: 33 checks passed and 11 were skipped here (the cross-type POST /.search Tandem answers 501 for).
    assert Counter(r.status for r in results)[Status.SUCCESS] >= 30
