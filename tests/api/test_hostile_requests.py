"""Hand-made hostile requests on every route get a 4xx, change nothing and log no traceback.

For each route and method: hostile path parameters (newlines, NUL, broken UTF-8, very
long, huge numbers, traversal), hostile query strings, hostile bodies (broken UTF-8,
deep nesting, huge numbers, wrong types) and absurd microversions. The caller is an
admin holding the service role, so the input reaches the handlers rather than policy.
Every table's content is compared before and after; the log is checked for errors.
"""

from __future__ import annotations

import logging
import uuid as uuidlib

import pytest
from sqlalchemy import select

from acceld.api import routes
from acceld.db.models import Base
from tests.helpers import ADMIN, version
from tests.support import inventory

HEADERS = {**ADMIN, "X-Service-Roles": "service", **version("2.5")}
PATH_VALUES = ("%0A", "{valid}%0A", "{valid}%0D%0A", "%00", "{valid}%00", "%FF%FE", "é%FF",
               "x" * 3000, "-1", "99999999999999999999999", "..%2F..%2Fetc", "%20{valid}",
               "{valid}%20")
QUERIES = ("%FF=1", "limit=%FF", "instance=%0A", "instance={valid}%0A", "arqs=%00",
           "arqs={valid}%0A", "value=%FF", "deployable_id=1%0A", "device_id=99999999999999999999",
           "filters=%5B%5D", "state=%00", "marker={valid}%0A", "limit=1%0A", "limit=-99999")
BODIES = (b"\xff\xfe{\x00", b"[" * 5000 + b"]" * 5000, b'{"a": 1e999}', b"123", b'"text"',
          b"null", b'{"deployable_id": 100000000000000000000000000000, "key": "k", "value": "v"}',
          b'[{"op": "replace", "path": "/status", "value": "\\ud800"}]',
          b'{"device_profile_name": ["a"]}', b'{"' + b"k" * 70000 + b'": 1}')
MICROVERSIONS = ("accelerator 2.99999999999999999999999", "accelerator 99999999999999999999.0",
                 "accelerator 2.-1", "accelerator ", "accelerator 2.5 2.4", "accelerator 2.\xff",
                 "accelerator 0x2.0x5", "accelerator 2.5.1", "accelerator ².５")
# Routes that read no body (upstream's enable and disable): a body there is ignored.
BODILESS = {"/v2/devices/{uuid}/enable", "/v2/devices/{uuid}/disable"}


@pytest.fixture
def world(client, db) -> dict[str, str]:  # type: ignore[no-untyped-def]
    resp = client.simulate_post("/v2/device_profiles", headers=HEADERS,
                                json=[{"name": "hostile-dp", "groups": [{"resources:FPGA": "1"}]}])
    assert resp.status_code == 201, resp.text
    with db.write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        dep = inventory.add_deployable(conn, device["id"], name="node1_hostile")
        inventory.add_attach_handles(conn, dep["id"], 1)
        inventory.add_attribute(conn, dep["id"], "trait0", "CUSTOM_HOSTILE")
    arq = client.simulate_post("/v2/accelerator_requests", headers=HEADERS,
                               json={"device_profile_name": "hostile-dp"}).json["arqs"][0]
    return {"arq": arq["uuid"], "device": device["uuid"], "deployable": dep["uuid"]}


def _snapshot(db) -> dict[str, list]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return {t.name: sorted(map(repr, conn.execute(select(t)).all()))
                for t in Base.metadata.sorted_tables}


def _fill(route: str, value: str, valid: str) -> str:
    """The route with every parameter set to ``value`` ({valid} stands for a real uuid)."""
    path = route
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        path = path[:start] + value.replace("{valid}", valid) + path[end + 1:]
    return "/accelerator" + path


def _valid_for(route: str, world: dict[str, str]) -> str:
    if "accelerator_requests" in route:
        return world["arq"]
    if "devices" in route:
        return world["device"]
    if "deployables" in route:
        return world["deployable"]
    if "device_profiles" in route:
        return "hostile-dp"
    if "hosts" in route:
        return "node1"
    return str(uuidlib.uuid4())


# The version documents answer every GET (discovery sends no microversion and clients may
# add anything to the query): nothing hostile can reach them.
CASES = [(route, method) for route, methods in routes.ROUTES.items() for method in methods
         if route not in ("/", "/v2")]


@pytest.mark.parametrize("route, method", CASES, ids=[f"{m} {r}" for r, m in CASES])
def test_hostile_input_is_a_4xx_that_changes_nothing(client, db, world, caplog, route,
                                                     method) -> None:
    caplog.set_level(logging.WARNING)
    before = _snapshot(db)
    valid = _valid_for(route, world)
    sent: list[tuple[str, int]] = []

    def call(path: str, *, query: str | None = None, body: bytes | None = None,
             headers: dict | None = None) -> None:
        kwargs: dict = {"headers": {**HEADERS, **(headers or {})}, "query_string": query}
        if body is not None:
            kwargs["body"] = body
            kwargs["headers"]["Content-Type"] = "application/json"
        result = client.simulate_request(method, path, **kwargs)
        sent.append((f"{path[:80]}?{(query or '')[:60]} body={(body or b'')[:30]!r} "
                     f"{headers or ''}", result.status_code))

    good_path = _fill(route, "{valid}", valid)
    if "{" in route:
        for value in PATH_VALUES:
            call(_fill(route, value, valid))
    for query in QUERIES:
        call(good_path, query=query.replace("{valid}", valid))
    if method in ("POST", "PATCH") and route not in BODILESS:
        for body in BODIES:
            call(good_path, body=body)
    for header in MICROVERSIONS:
        call(good_path, headers={"OpenStack-API-Version": header})
    bad = [(what, status) for what, status in sent if not 400 <= status < 500]
    assert bad == [], bad
    assert _snapshot(db) == before
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage()[:200] for r in errors]
