"""Every uuid and integer id the API accepts is exactly one: trailing junk is a 400.

JSON-schema patterns are matched with Python's ``re.search``, where ``$`` also matches
before a final newline: ``"<uuid>\\n"`` passed them and reached code that expects a
canonical uuid (500s), and ``?arqs=<uuid>%0A`` was stripped and deleted the ARQ. Each
case below sends the junk and checks nothing changed.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest

from acceld.api import schemas as schema_package
from tests.helpers import ADMIN, fault, member
from tests.support import inventory

ARQ = "/v2/accelerator_requests"
A = "project-a"
NOVA = {**member(A), "X-Service-Roles": "service"}
JUNK = ("\n", "\r\n", " ", "\t", "x")


@pytest.fixture
def world(client, db) -> dict:  # type: ignore[no-untyped-def]
    resp = client.simulate_post("/v2/device_profiles", headers=ADMIN,
                                json=[{"name": "junk-dp", "groups": [{"resources:FPGA": "1"}]}])
    assert resp.status_code == 201, resp.text
    with db.write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        dep = inventory.add_deployable(conn, device["id"], name="node1_junk")
        inventory.add_attach_handles(conn, dep["id"], 1)
    arq = client.simulate_post(ARQ, headers=NOVA,
                               json={"device_profile_name": "junk-dp"}).json["arqs"][0]
    return {"arq": arq["uuid"], "rp": dep["rp_uuid"], "deployable_id": dep["id"],
            "device_id": device["id"]}


def _bind(rp: str, instance: str) -> list[dict]:
    return [{"op": "add", "path": "/hostname", "value": "node1"},
            {"op": "add", "path": "/device_rp_uuid", "value": rp},
            {"op": "add", "path": "/instance_uuid", "value": instance}]


def _state(client, arq: str) -> str:  # type: ignore[no-untyped-def]
    resp = client.simulate_get(f"{ARQ}/{arq}", headers=NOVA)
    assert resp.status_code == 200, resp.text
    return resp.json["state"]


@pytest.mark.parametrize("junk", JUNK)
def test_patch_keys_and_values(client, world, junk) -> None:
    arq, rp, instance = world["arq"], world["rp"], str(uuidlib.uuid4())
    for body in ({arq + junk: _bind(rp, instance)},
                 {arq: _bind(rp + junk, instance)},
                 {arq: _bind(rp, instance + junk)}):
        for path in (ARQ, f"{ARQ}/{arq}"):
            resp = client.simulate_patch(path, headers=NOVA, json=body)
            assert resp.status_code in (400, 404), (path, body, resp.status_code, resp.text)
            if path == ARQ:
                assert resp.status_code == 400, resp.text
    assert _state(client, arq) == "Initial"


@pytest.mark.parametrize("junk", JUNK)
def test_delete_by_arqs_and_instance(client, world, junk) -> None:
    arq = world["arq"]
    for query in (f"arqs={arq}{junk}", f"arqs={arq},{arq}{junk}",
                  f"instance={uuidlib.uuid4()}{junk}"):
        resp = client.simulate_delete(ARQ, headers=NOVA, query_string=query)
        assert resp.status_code == 400, (query, resp.status_code, resp.text)
        assert "UUID" in fault(resp) or "uuid" in fault(resp)
    resp = client.simulate_get(ARQ, headers=NOVA, query_string=f"instance={uuidlib.uuid4()}{junk}")
    assert resp.status_code == 400, resp.text
    assert _state(client, arq) == "Initial"


@pytest.mark.parametrize("junk", JUNK)
def test_device_profile_uuid(client, db, junk) -> None:
    body = [{"name": "dp-junk", "uuid": str(uuidlib.uuid4()) + junk,
             "groups": [{"resources:FPGA": "1"}]}]
    resp = client.simulate_post("/v2/device_profiles", headers=ADMIN, json=body)
    assert resp.status_code == 400, resp.text
    listed = client.simulate_get("/v2/device_profiles", headers=ADMIN).json["device_profiles"]
    assert "dp-junk" not in [p["name"] for p in listed]


@pytest.mark.parametrize("junk", JUNK)
def test_attribute_and_deployable_ids(client, world, junk) -> None:
    dep_id = str(world["deployable_id"])
    resp = client.simulate_post("/v2/attributes", headers=ADMIN,
                                json={"deployable_id": dep_id + junk, "key": "trait5",
                                      "value": "CUSTOM_JUNK"})
    assert resp.status_code == 400, resp.text
    for path, query in (("/v2/attributes", f"deployable_id={dep_id}{junk}"),
                        ("/v2/deployables", f"device_id={world['device_id']}{junk}"),
                        ("/v2/deployables", f"rp_uuid={world['rp']}{junk}")):
        resp = client.simulate_get(path, headers=ADMIN, query_string=query)
        assert resp.status_code == 400, (path, query, resp.status_code, resp.text)
    attrs = client.simulate_get("/v2/attributes", headers=ADMIN).json["attributes"]
    assert "CUSTOM_JUNK" not in [a["value"] for a in attrs]


def _patterns(node, where: str):  # type: ignore[no-untyped-def]
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield where, value
            if key == "patternProperties" and isinstance(value, dict):
                for name in value:
                    yield f"{where}.patternProperties", name
            yield from _patterns(value, f"{where}.{key}")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _patterns(value, f"{where}[{i}]")


def test_no_schema_pattern_ends_in_a_dollar() -> None:
    """The audit: an anchored pattern ends in \\Z, which matches only at the very end."""
    import importlib
    import pkgutil

    found = []
    for info in pkgutil.iter_modules(schema_package.__path__):
        module = importlib.import_module(f"{schema_package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, (dict, list, tuple)):
                found += [(f"{info.name}.{name}{w}", p) for w, p in _patterns(value, "")]
            elif isinstance(value, str) and name.endswith("PATTERN"):
                found.append((f"{info.name}.{name}", value))
    assert found, "no patterns found: the walk is broken"
    assert [(w, p) for w, p in found if p.endswith("$")] == []
