"""/api/docs/ works on a cluster without internet: Swagger UI comes from drf-spectacular-sidecar, served by us."""
import re
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_docs_reference_only_this_server_and_every_asset_is_served(live_server):
    page = httpx.get(live_server.url + "/api/docs/")
    assert page.status_code == 200
    html = page.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs, html
    origin = urlsplit(live_server.url).netloc
    external = [r for r in refs if urlsplit(urljoin(live_server.url + "/api/docs/", r)).netloc != origin]
    assert external == [] and "cdn" not in html.lower()
    served = {r: httpx.get(urljoin(live_server.url + "/api/docs/", r.replace("&amp;", "&"))) for r in refs}
    assert {r: resp.status_code for r, resp in served.items()} == {r: 200 for r in refs}
    scripts = [served[r] for r in re.findall(r'<script src="([^"]+)"', html)]
    assert len(scripts) == 3 and all("javascript" in s.headers["content-type"] for s in scripts)
    assert any("SwaggerUIBundle" in s.text for s in scripts)
