"""A project's ARQ limit from Keystone's unified limits, through oslo.limit, end to end.

The real Keystone the suite prepares holds a registered limit (the default for every
project) and a project limit for one project on resource ``accelerator_requests`` of the
accelerator service; `acceld api` runs with ``[quota] driver = unified_limits`` and reads
them as the ``cyborg`` service user, holding the system-scoped reader role oslo.limit needs.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import requests
from sqlalchemy import func, select

from acceld.db.models import accelerator_requests
from tests.support import keystone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESOURCE = "accelerator_requests"
DEFAULT_LIMIT = 2  # registered limit: every project
DEMO2_LIMIT = 5  # project limit of demo2


class Admin:
    """Keystone's REST API with the admin token."""

    def __init__(self, ks: keystone.Keystone) -> None:
        self.url = ks.url
        self.session = requests.Session()
        self.session.headers["X-Auth-Token"] = ks.token("admin")

    def call(self, method: str, path: str, **kwargs) -> dict:  # type: ignore[no-untyped-def]
        resp = self.session.request(method, self.url + path, timeout=30, **kwargs)
        assert resp.status_code < 300, (method, path, resp.status_code, resp.text[:500])
        return resp.json() if resp.content else {}

    def one(self, path: str, key: str, **params: str) -> dict:
        items = self.call("GET", path, params=params)[key]
        assert len(items) == 1, items
        return items[0]


@pytest.fixture(scope="module")
def limits(ks) -> dict:
    """The registered limit, demo2's project limit, and the service user's system reader."""
    admin = Admin(ks)
    service = admin.one("/v3/services", "services", type="accelerator")["id"]
    reader = admin.one("/v3/roles", "roles", name="reader")["id"]
    cyborg = admin.one("/v3/users", "users", name="cyborg")["id"]
    admin.call("PUT", f"/v3/system/users/{cyborg}/roles/{reader}")
    admin.call("POST", "/v3/registered_limits", json={"registered_limits": [
        {"service_id": service, "region_id": keystone.REGION, "resource_name": RESOURCE,
         "default_limit": DEFAULT_LIMIT}]})
    made = admin.call("POST", "/v3/limits", json={"limits": [
        {"service_id": service, "region_id": keystone.REGION, "resource_name": RESOURCE,
         "project_id": ks.project_id("demo2"), "resource_limit": DEMO2_LIMIT}]})
    return {"admin": admin, "demo2_limit_id": made["limits"][0]["id"]}


@pytest.fixture(scope="module")
def api(ks, limits, tmp_path_factory) -> Iterator[dict]:
    extra = (f"[quota]\ndriver = unified_limits\n"
             f"[oslo_limit]\nauth_url = {ks.url}/v3\nauth_type = password\nusername = cyborg\n"
             f"password = {keystone.PASSWORD}\nuser_domain_id = default\nsystem_scope = all\n"
             f"endpoint_service_type = accelerator\nendpoint_region_name = {keystone.REGION}\n"
             f"endpoint_interface = public\n")
    with keystone.acceld_api(ks, tmp_path_factory.mktemp("acceld"), extra) as client:
        for name, groups in (("one", [{"resources:FPGA": "1"}]),
                             ("three", [{"resources:FPGA": "1"}, {"resources:PGPU": "2"}])):
            made = _call(client, ks, "POST", "/v2/device_profiles", "admin",
                         json=[{"name": name, "groups": groups}])
            assert made.status_code == 201, made.text
        yield client


def _call(api: dict, ks: keystone.Keystone, method: str, path: str, user: str,
          **kwargs) -> requests.Response:
    return requests.request(method, api["base"] + "/accelerator" + path, timeout=30,
                            headers={"X-Auth-Token": ks.token(user)}, **kwargs)


def _create(api, ks, user: str, profile: str) -> requests.Response:  # type: ignore[no-untyped-def]
    return _call(api, ks, "POST", "/v2/accelerator_requests", user,
                 json={"device_profile_name": profile})


def _held(api: dict, ks: keystone.Keystone, project: str) -> int:
    with api["db"].read() as conn:
        return conn.execute(select(func.count()).select_from(accelerator_requests).where(
            accelerator_requests.c.project_id == ks.project_id(project))).scalar_one()


def _fault(resp: requests.Response) -> str:
    import json

    return json.loads(resp.json()["error_message"])["faultstring"]


def test_the_registered_limit_applies_to_every_project(api, ks) -> None:
    for _ in range(DEFAULT_LIMIT):
        assert _create(api, ks, "demo-member", "one").status_code == 201
    refused = _create(api, ks, "demo-member", "one")
    assert refused.status_code == 403, refused.text
    assert _fault(refused) == (
        f"Quota exceeded for {RESOURCE}: project {ks.project_id('demo')} may hold "
        f"{DEFAULT_LIMIT} (Keystone unified limit on {RESOURCE}), holds {DEFAULT_LIMIT} and "
        "asked for 1 more.")
    assert _held(api, ks, "demo") == DEFAULT_LIMIT
    # Deleting one makes room again.
    arqs = _call(api, ks, "GET", "/v2/accelerator_requests", "demo-member").json()["arqs"]
    gone = _call(api, ks, "DELETE", f"/v2/accelerator_requests/{arqs[0]['uuid']}",
                 "demo-member")
    assert gone.status_code == 204, gone.text
    assert _create(api, ks, "demo-member", "one").status_code == 201


def test_a_project_limit_wins_and_a_profile_is_refused_whole(api, ks) -> None:
    assert _create(api, ks, "demo2-member", "three").status_code == 201  # 3 > default 2
    refused = _create(api, ks, "demo2-member", "three")  # 3 + 3 > 5, in two groups
    assert refused.status_code == 403, refused.text
    assert f"may hold {DEMO2_LIMIT} (Keystone unified limit" in _fault(refused)
    assert "holds 3 and asked for 3 more" in _fault(refused)
    assert _held(api, ks, "demo2") == 3


def test_a_changed_limit_applies_at_once(api, ks, limits) -> None:
    made = [_create(api, ks, "demo2-member", "one").status_code
            for _ in range(DEMO2_LIMIT - _held(api, ks, "demo2") + 1)]
    assert made[-1] == 403 and set(made[:-1]) == {201}
    assert _held(api, ks, "demo2") == DEMO2_LIMIT
    limits["admin"].call("PATCH", f"/v3/limits/{limits['demo2_limit_id']}",
                         json={"limit": {"resource_limit": DEMO2_LIMIT + 3}})
    assert _create(api, ks, "demo2-member", "three").status_code == 201
    assert _create(api, ks, "demo2-member", "one").status_code == 403
    assert _held(api, ks, "demo2") == DEMO2_LIMIT + 3
