"""The insights' tabs and nav links: each role sees the pages it may open, and every tab
it sees answers 200."""

import re

import pytest


def _tabs(client, url):
    response = client.get(url)
    assert response.status_code == 200, url
    html = response.content.decode()
    nav = re.search(r'<nav class="insights-tabs".*?</nav>', html, re.S).group(0)
    return html, dict(re.findall(r'<a href="([^"]+)" id="tab-([a-z]+)"', nav))


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("member", {"usage"}),
        ("viewer", {"usage"}),
        ("tenant_admin", {"insights", "usage", "recommendations", "reviews"}),
        ("platform_admin", {"insights", "usage", "recommendations", "reviews", "simulator"}),
    ],
)
def test_each_role_sees_the_tabs_it_may_open(client, world, role, expected):
    client.force_login(getattr(world, role))
    html, tabs = _tabs(client, "/usage/")
    assert set(tabs.values()) == expected
    for url in tabs:
        assert client.get(url).status_code == 200, url
    # The top nav links to the overview for admins, to usage for the others.
    assert ('id="nav-insights"' in html) == ("insights" in expected)
    assert ('id="nav-usage"' in html) == ("insights" not in expected)


def test_the_active_tab_is_marked(client, world):
    client.force_login(world.tenant_admin)
    html = client.get("/recommendations/").content.decode()
    assert re.search(r'id="tab-recommendations" class="active" aria-current="page"', html)
    assert not re.search(r'id="tab-usage" class="active"', html)
