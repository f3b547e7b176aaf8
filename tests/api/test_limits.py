"""Hostile sizes: each limit answers 4xx naming the limit, and changes nothing.

Below microversion 2.5 no list endpoint takes `limit`/`marker` (upstream Cyborg
has none): they are unknown query parameters, refused with 400. From 2.5 the
ARQ list pages with a maximum page size (tests/api/test_arq_pagination.py).
"""

from __future__ import annotations

import uuid as uuidlib

import pytest
from falcon import testing

from acceld.api.app import build_app
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE, fault, member

ARQ = "/v2/accelerator_requests"


@pytest.fixture
def limited(tmp_path, sqlite_db) -> testing.TestClient:
    conf = make_conf(str(tmp_path), api__max_request_body_size=2048,
                     api__max_patch_operations=3, api__max_arqs_per_delete=3)
    return testing.TestClient(build_app(conf, sqlite_db))


def _profiles(client) -> list:  # type: ignore[no-untyped-def]
    return client.simulate_get("/v2/device_profiles", headers=ADMIN).json["device_profiles"]


def test_body_over_the_limit_is_413_naming_it(limited) -> None:
    body = [{"name": "big", "description": "x" * 200,
             "groups": [{f"accel:k{i}": "v" * 40} for i in range(60)]}]
    resp = limited.simulate_post("/v2/device_profiles", headers=ADMIN, json=body)
    assert resp.status_code == 413
    assert "2048 bytes" in fault(resp)
    assert _profiles(limited) == []


def test_declared_length_over_the_limit_is_refused_before_reading(limited) -> None:
    resp = limited.simulate_post("/v2/device_profiles", body=b"[]",
                                 headers={**ADMIN, "Content-Type": "application/json",
                                          "Content-Length": "999999"})
    assert resp.status_code == 413
    assert "limit is 2048 bytes" in fault(resp)


def test_too_many_arqs_in_one_patch(limited) -> None:
    ops = [{"op": "add", "path": "/hostname", "value": "n"}]
    body = {str(uuidlib.uuid4()): ops for _ in range(4)}
    resp = limited.simulate_patch(ARQ, headers=SERVICE, json=body)
    assert resp.status_code == 400
    assert "max_patch_operations" in fault(resp) and "at most 3" in fault(resp)


def test_too_many_arqs_in_one_delete(limited) -> None:
    arqs = ",".join(str(uuidlib.uuid4()) for _ in range(4))
    resp = limited.simulate_delete(ARQ, headers=member("p"), query_string=f"arqs={arqs}")
    assert resp.status_code == 400
    assert "max_arqs_per_delete" in fault(resp) and "at most 3" in fault(resp)


@pytest.mark.parametrize("path", ["/v2/device_profiles", ARQ, "/v2/devices",
                                  "/v2/deployables", "/v2/attributes"])
def test_lists_refuse_paging_parameters(limited, path: str) -> None:
    resp = limited.simulate_get(path, headers=ADMIN, query_string="limit=100000")
    assert resp.status_code == 400
    assert "Unknown query parameter 'limit'" in fault(resp)


def test_deeply_nested_json_is_a_clean_400(limited) -> None:
    body = b"[" * 600 + b"]" * 600
    resp = limited.simulate_post("/v2/device_profiles", body=body,
                                 headers={**ADMIN, "Content-Type": "application/json"})
    assert resp.status_code == 400


def test_limits_are_configurable_with_sane_minimums(tmp_path) -> None:
    conf = make_conf(str(tmp_path))
    assert conf.api.max_request_body_size == 1024 * 1024
    with pytest.raises(ValueError):
        conf.set_override("max_patch_operations", 0, group="api")
