"""GET /v2/accelerator_requests pages from microversion 2.5: limit, marker, arqs_links.

Below 2.5 the list is upstream's: whole, and limit/marker are unknown parameters (400).
"""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
from falcon import testing
from sqlalchemy import update

from acceld.api.app import build_app
from acceld.db.models import accelerator_requests
from tests.conftest import count_queries, make_conf
from tests.helpers import ADMIN, fault, member, version

URL = "/accelerator/v2/accelerator_requests"
DP_URL = "/accelerator/v2/device_profiles"
V25 = version("2.5")


@pytest.fixture
def small_pages(tmp_path, db) -> testing.TestClient:
    """max_limit 4, and a profile of 3 ARQs."""
    client = testing.TestClient(build_app(make_conf(str(tmp_path), api__max_limit=4), db))
    made = client.simulate_post(DP_URL, headers=ADMIN,
                                json=[{"name": "three", "groups": [{"resources:FPGA": "3"}]}])
    assert made.status_code == 201, made.text
    return client


def _create(client, headers) -> list[str]:  # type: ignore[no-untyped-def]
    resp = client.simulate_post(URL, json={"device_profile_name": "three"}, headers=headers)
    assert resp.status_code == 201, resp.text
    return [a["uuid"] for a in resp.json["arqs"]]


def _get(client, headers, query="", v=V25):  # type: ignore[no-untyped-def]
    return client.simulate_get(URL, query_string=query, headers={**headers, **v})


def _walk(client, headers, query: str) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    """Follow arqs_links from the first page; the uuids in order and the pages read."""
    seen: list[str] = []
    pages = 0
    while True:
        resp = _get(client, headers, query)
        assert resp.status_code == 200, resp.text
        pages += 1
        seen += [a["uuid"] for a in resp.json["arqs"]]
        links = resp.json.get("arqs_links")
        if not links:
            return seen, pages
        assert [link["rel"] for link in links] == ["next"]
        href = urlsplit(links[0]["href"])
        assert href.path == URL
        query = href.query
        assert parse_qs(query)["marker"] == [seen[-1]]


def test_pages_walk_every_arq_once_in_creation_order(small_pages):
    a = member("project-a")
    mine = _create(small_pages, a) + _create(small_pages, a) + _create(small_pages, a)
    _create(small_pages, member("project-b"))
    seen, pages = _walk(small_pages, a, "limit=2")
    assert seen == mine and pages == 5
    # Without limit the page is [api] max_limit (4): 4 + 4 + 1.
    assert _walk(small_pages, a, "") == (mine, 3)
    # A limit over max_limit is lowered to it, not refused (Nova, Ironic).
    first = _get(small_pages, a, "limit=1000")
    assert len(first.json["arqs"]) == 4 and "arqs_links" in first.json
    # The last page carries no link: a page that ends exactly at the last row too.
    last = _get(small_pages, a, f"limit=3&marker={mine[5]}")
    assert [x["uuid"] for x in last.json["arqs"]] == mine[6:] and "arqs_links" not in last.json


def test_next_link_keeps_the_filters(small_pages, db):
    a = member("project-a")
    mine = _create(small_pages, a)
    _create(small_pages, a)
    instance = str(uuid.uuid4())
    with db.write() as conn:
        conn.execute(update(accelerator_requests).where(
            accelerator_requests.c.uuid.in_(mine)).values(instance_uuid=instance))
    resp = _get(small_pages, a, f"instance={instance}&limit=2")
    assert [x["uuid"] for x in resp.json["arqs"]] == mine[:2]
    href = resp.json["arqs_links"][0]["href"]
    assert href.startswith("http://falconframework.org/accelerator/v2/accelerator_requests?")
    assert parse_qs(urlsplit(href).query) == {"instance": [instance], "limit": ["2"],
                                              "marker": [mine[1]]}
    seen, pages = _walk(small_pages, a, f"instance={instance}&limit=2")
    assert seen == mine and pages == 2


def test_admin_pages_span_projects(small_pages):
    mine = _create(small_pages, member("project-a"))
    theirs = _create(small_pages, member("project-b"))
    seen, _ = _walk(small_pages, ADMIN, "limit=2")
    assert seen == mine + theirs


def test_below_2_5_the_list_is_whole_and_paging_is_unknown(small_pages):
    a = member("project-a")
    mine = _create(small_pages, a) + _create(small_pages, a)
    for v in ({}, version("2.4")):
        whole = _get(small_pages, a, "", v)
        assert [x["uuid"] for x in whole.json["arqs"]] == mine  # 6 > max_limit 4
        assert set(whole.json) == {"arqs"}
        for query in ("limit=2", f"marker={mine[0]}"):
            resp = _get(small_pages, a, query, v)
            assert resp.status_code == 400
            assert "Unknown query parameter" in fault(resp)


@pytest.mark.parametrize("value", ["0", "-1", "-0", "1.5", "abc", "", " 2", "2 ", "+2", "0x10",
                                   "２", "2\n"])
def test_bad_limits_are_400(small_pages, value):
    from urllib.parse import quote

    resp = _get(small_pages, member("project-a"), f"limit={quote(value)}")
    assert resp.status_code == 400, resp.text
    assert "query parameter limit" in fault(resp)


@pytest.mark.parametrize("value", ["99999999999", "9" * 5000, "0004"])
def test_huge_limits_are_lowered(small_pages, value):
    a = member("project-a")
    mine = _create(small_pages, a) + _create(small_pages, a)
    resp = _get(small_pages, a, f"limit={value}")
    assert resp.status_code == 200
    assert [x["uuid"] for x in resp.json["arqs"]] == mine[:4]


def test_bad_markers_are_400(small_pages):
    a = member("project-a")
    mine = _create(small_pages, a)
    theirs = _create(small_pages, member("project-b"))
    from urllib.parse import quote

    for value in ("not-a-uuid", "", f"{mine[0]}\n", f"{mine[0]}x"):
        resp = _get(small_pages, a, f"marker={quote(value)}")
        assert resp.status_code == 400, (value, resp.text)
        assert "query parameter marker" in fault(resp)
    # Unknown and another project's answer alike: a marker tells nothing about others.
    unknown = str(uuid.uuid4())
    answers = []
    for value in (unknown, theirs[0]):
        resp = _get(small_pages, a, f"marker={value}")
        assert resp.status_code == 400
        answers.append(fault(resp).replace(value, "<marker>"))
    assert answers[0] == answers[1] == "Marker <marker> could not be found."
    # An admin may page from any project's ARQ.
    assert [x["uuid"] for x in _get(small_pages, ADMIN, f"marker={theirs[0]}").json["arqs"]] \
        == theirs[1:]


def test_a_page_is_constant_queries(small_pages, db):
    a = member("project-a")
    mine = [u for _ in range(4) for u in _create(small_pages, a)]
    with count_queries(db) as first:
        assert len(_get(small_pages, a, "limit=4").json["arqs"]) == 4
    with count_queries(db) as later:
        page = _get(small_pages, a, f"limit=4&marker={mine[3]}")
    assert [x["uuid"] for x in page.json["arqs"]] == mine[4:8]
    assert len(first) == 1 and len(later) == 2  # the marker's id, then the page
    assert all("LIMIT" in s.upper() for s in first + later[1:])
