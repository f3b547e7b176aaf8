"""/v2/accelerator_requests: every endpoint, status code and rule of the contract, per backend.

Binds are completed by driving the conductor's worker in process
(``BindWorker.run_once``): the API has no conductor here.
"""

from __future__ import annotations

import uuid

import orjson
import pytest
from sqlalchemy import func, select, update

from acceld.conductor.binding.worker import BindWorker
from acceld.db.models import accelerator_requests, attach_handles, bind_jobs, devices
from tests.conftest import count_queries
from acceld.api.handlers.accelerator_requests import WITHHELD_REASON
from tests.helpers import ADMIN, SERVICE, fault, member, version
from tests.support import inventory

URL = "/accelerator/v2/accelerator_requests"
DP_URL = "/accelerator/v2/device_profiles"
FIELDS = {"uuid", "state", "device_profile_name", "device_profile_group_id", "hostname",
          "device_rp_uuid", "instance_uuid", "project_id", "attach_handle_type",
          "attach_handle_uuid", "attach_handle_info", "links", "created_at", "updated_at"}
FPGA = {"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}
NOVA = {**member("project-a"), "X-Service-Roles": "service"}  # user token + service token


# ---------------------------------------------------------------------------- helpers

def make_profile(client, name="dp-a", groups=None) -> dict:
    result = client.simulate_post(DP_URL, json=[{"name": name, "groups": groups or [FPGA]}],
                                  headers=ADMIN)
    assert result.status_code == 201, result.text
    return result.json


def create(client, name="dp-a", headers=None) -> list[dict]:
    result = client.simulate_post(URL, json={"device_profile_name": name},
                                  headers=headers or NOVA)
    assert result.status_code == 201, result.text
    return result.json["arqs"]


def bind_ops(hostname: str, rp_uuid: str, instance: str) -> list[dict]:
    return [{"op": "add", "path": "/hostname", "value": hostname},
            {"op": "add", "path": "/device_rp_uuid", "value": rp_uuid},
            {"op": "add", "path": "/instance_uuid", "value": instance}]


UNBIND_OPS = [{"op": "remove", "path": "/hostname"}, {"op": "remove", "path": "/device_rp_uuid"},
              {"op": "remove", "path": "/instance_uuid"}]


def patch(client, body, headers=None, uuid_in_path=None, extra_headers=None):
    url = f"{URL}/{uuid_in_path}" if uuid_in_path else URL
    return client.simulate_patch(url, json=body,
                                 headers={**(headers or NOVA), **(extra_headers or {})})


def worker(conf, db) -> BindWorker:
    return BindWorker(conf, db)


def run_binds(conf, db) -> None:
    w = worker(conf, db)
    while w.run_once():
        pass


def get(client, arq_uuid, headers=None, v=None) -> dict:
    result = client.simulate_get(f"{URL}/{arq_uuid}",
                                 headers={**(headers or NOVA), **(version(v) if v else {})})
    assert result.status_code == 200, result.text
    return result.json


def handles_in_use(db) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(attach_handles).where(
            attach_handles.c.in_use == True)).scalar_one()  # noqa: E712


def arq_count(db) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(accelerator_requests)).scalar_one()


@pytest.fixture
def fpga(db):
    return inventory.add_fpga(db, hostname="node1", handles=2)


@pytest.fixture
def profile(client):
    return make_profile(client)


# ---------------------------------------------------------------------------- create

def test_create_one_arq_per_accelerator_per_group(client, db):
    make_profile(client, "dp-b", [FPGA, {"resources:PGPU": "2", "trait:CUSTOM_X": "required"},
                                  {"trait:CUSTOM_ONLY": "required"}])
    result = client.simulate_post(URL, json={"device_profile_name": "dp-b"}, headers=NOVA)
    assert result.status_code == 201
    arqs = result.json["arqs"]
    assert [a["device_profile_group_id"] for a in arqs] == [0, 1, 1]
    for arq in arqs:
        assert set(arq) == FIELDS
        assert arq["state"] == "Initial"
        assert arq["device_profile_name"] == "dp-b"
        assert arq["project_id"] == "project-a"
        assert (arq["hostname"], arq["device_rp_uuid"], arq["instance_uuid"]) == (None,) * 3
        assert arq["attach_handle_type"] == ""
        assert arq["attach_handle_info"] == {}
        assert arq["attach_handle_uuid"] is None
        assert arq["updated_at"] is None and arq["created_at"].endswith("+00:00")
        assert arq["links"] == [{"href": f"http://falconframework.org{URL}/{arq['uuid']}",
                                 "rel": "self"}]
    assert len({a["uuid"] for a in arqs}) == 3
    assert arq_count(db) == 3


def test_create_runs_constant_queries(client, db):
    make_profile(client, "small", [{"resources:FPGA": "1"}])
    make_profile(client, "big", [{"resources:FPGA": "40"}, {"resources:PGPU": "60"}])
    with count_queries(db) as small:
        assert len(create(client, "small")) == 1
    with count_queries(db) as big:
        assert len(create(client, "big")) == 100
    # Profile, the project's lock row (acceld.db.project_lock: one upsert, every backend),
    # the project's ARQ count (its limit), the insert.
    assert len(big) == len(small) <= 4


@pytest.mark.parametrize("name", ["absent", "", "  "])
def test_create_for_unknown_or_empty_profile_is_404(client, db, name):
    result = client.simulate_post(URL, json={"device_profile_name": name}, headers=NOVA)
    assert result.status_code == 404
    assert arq_count(db) == 0


@pytest.mark.parametrize("body, words", [
    ({}, "device_profile_name"),
    ({"device_profile_name": 5}, "string"),
    ({"device_profile_name": "dp-a", "extra": 1}, "extra"),
    (["dp-a"], "object"),
])
def test_create_rejects_bad_bodies(client, db, profile, body, words):
    result = client.simulate_post(URL, json=body, headers=NOVA)
    assert result.status_code == 400
    assert words in fault(result)
    assert arq_count(db) == 0


def test_create_refuses_more_than_the_limit(client, db):
    make_profile(client, "huge", [{"resources:FPGA": "999999999"}])
    result = client.simulate_post(URL, json={"device_profile_name": "huge"}, headers=NOVA)
    assert result.status_code == 400
    assert "max_arqs_per_create" in fault(result)
    assert arq_count(db) == 0


def test_create_needs_a_member(client, db, profile):
    reader = {"X-User-Id": "u", "X-Project-Id": "project-a", "X-Roles": "reader"}
    result = client.simulate_post(URL, json={"device_profile_name": "dp-a"}, headers=reader)
    assert result.status_code == 403
    assert arq_count(db) == 0


# ---------------------------------------------------------------------------- list and show

def test_list_show_and_ownership(client, db, profile):
    mine = create(client)
    theirs = create(client, headers=member("project-b"))
    result = client.simulate_get(URL, headers=NOVA)
    assert result.status_code == 200
    assert [a["uuid"] for a in result.json["arqs"]] == [mine[0]["uuid"]]
    assert get(client, mine[0]["uuid"]) == result.json["arqs"][0]
    # Another project's ARQ does not exist for this caller.
    result = client.simulate_get(f"{URL}/{theirs[0]['uuid']}", headers=NOVA)
    assert result.status_code == 404
    assert theirs[0]["uuid"] in fault(result)
    # Admins see every project.
    result = client.simulate_get(URL, headers=ADMIN)
    assert {a["uuid"] for a in result.json["arqs"]} == {mine[0]["uuid"], theirs[0]["uuid"]}


@pytest.mark.parametrize("ident", ["fefe3c32-46c0-46f6-b5e9-000b7874ecb8", "not-a-uuid"])
def test_show_unknown_is_404(client, ident):
    assert client.simulate_get(f"{URL}/{ident}", headers=NOVA).status_code == 404


@pytest.mark.parametrize("query, words", [
    ("instance=abc", "instance"),
    ("instance=44f3b55d-fc81-4182-bb46-f17702538547&bind_state=started", "bind_state"),
    ("bind_state=", "bind_state"),
    ("color=red", "color"),
])
def test_list_rejects_bad_queries(client, query, words):
    result = client.simulate_get(URL, query_string=query, headers=NOVA)
    assert result.status_code == 400
    assert words in fault(result)


def test_list_runs_constant_queries_for_1000_arqs(client, db):
    make_profile(client, "many", [{"resources:FPGA": "1000"}])
    make_profile(client, "one", [{"resources:FPGA": "1"}])
    create(client, "one", headers=ADMIN)
    with count_queries(db) as few:
        assert len(client.simulate_get(URL, headers=ADMIN).json["arqs"]) == 1
    create(client, "many", headers=ADMIN)
    with count_queries(db) as many:
        result = client.simulate_get(URL, headers=ADMIN)
    assert len(result.json["arqs"]) == 1001
    assert len(many) == len(few) == 1


def test_reader_may_list_but_not_bind(client, db, profile):
    create(client)
    reader = {"X-User-Id": "u", "X-Project-Id": "project-a", "X-Roles": "reader"}
    assert len(client.simulate_get(URL, headers=reader).json["arqs"]) == 1
    outsider = {"X-User-Id": "u", "X-Project-Id": "project-a", "X-Roles": "nothing"}
    assert client.simulate_get(URL, headers=outsider).status_code == 403


# ---------------------------------------------------------------------------- bind

def test_bind_resolves_bound_with_the_handle(client, conf, db, fpga, profile):
    arq = create(client)[0]
    instance = str(uuid.uuid4())
    rp = fpga["deployable"]["rp_uuid"]
    result = patch(client, {arq["uuid"]: bind_ops("node1", rp, instance)})
    assert result.status_code == 202
    assert result.content == b""
    started = get(client, arq["uuid"])
    assert started["state"] == "BindStarted"
    assert (started["hostname"], started["device_rp_uuid"], started["instance_uuid"]) == \
        ("node1", rp, instance)
    assert started["attach_handle_type"] == "" and started["attach_handle_info"] == {}
    run_binds(conf, db)
    bound = get(client, arq["uuid"])
    assert bound["state"] == "Bound"
    handle = fpga["handles"][0]
    assert bound["attach_handle_type"] == "PCI"
    assert bound["attach_handle_uuid"] == handle["uuid"]
    assert bound["attach_handle_info"] == {"domain": "0000", "bus": "5e", "device": "00",
                                           "function": "0"}
    assert bound["updated_at"] is not None
    assert handles_in_use(db) == 1
    with db.read() as conn:  # the job is gone once Nova was told (here: nothing to tell)
        assert conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one() == 0


def test_per_uuid_patch_as_the_sdk_sends_it(client, conf, db, fpga, profile):
    arq = create(client)[0]
    body = {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))}
    assert patch(client, body, uuid_in_path=arq["uuid"]).status_code == 202
    run_binds(conf, db)
    assert get(client, arq["uuid"])["state"] == "Bound"
    assert patch(client, {arq["uuid"]: UNBIND_OPS}, uuid_in_path=arq["uuid"]).status_code == 202
    assert get(client, arq["uuid"])["state"] == "Unbound"


def test_per_uuid_patch_must_name_that_uuid(client, db, fpga, profile):
    first, second = create(client)[0], create(client)[0]
    body = {second["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))}
    result = patch(client, body, uuid_in_path=first["uuid"])
    assert result.status_code == 400
    assert get(client, second["uuid"])["state"] == "Initial"
    assert patch(client, body, uuid_in_path="nope").status_code == 404


def test_one_collection_patch_binds_several(client, conf, db, fpga, profile):
    arqs = create(client) + create(client)
    instance = str(uuid.uuid4())
    body = {a["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"], instance) for a in arqs}
    assert patch(client, body).status_code == 202
    run_binds(conf, db)
    result = client.simulate_get(URL, query_string=f"instance={instance}", headers=NOVA)
    bound = result.json["arqs"]
    assert [a["state"] for a in bound] == ["Bound", "Bound"]
    assert len({a["attach_handle_uuid"] for a in bound}) == 2
    assert handles_in_use(db) == 2


def test_third_bind_on_two_handles_fails_with_reason(client, conf, db, fpga, profile):
    arqs = [create(client)[0] for _ in range(3)]
    rp = fpga["deployable"]["rp_uuid"]
    for arq in arqs:
        assert patch(client, {arq["uuid"]: bind_ops("node1", rp, str(uuid.uuid4()))}
                     ).status_code == 202
    run_binds(conf, db)
    states = [get(client, a["uuid"], ADMIN, v="2.4") for a in arqs]
    assert [s["state"] for s in states] == ["Bound", "Bound", "BindFailed"]
    assert "no free attach handle" in states[2]["bind_failure_reason"]
    assert states[0]["bind_failure_reason"] is None
    assert states[2]["attach_handle_type"] == "" and states[2]["attach_handle_info"] == {}
    assert handles_in_use(db) == 2


def test_bind_failure_reason_only_from_2_4(client, conf, db, profile):
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", str(uuid.uuid4()), str(uuid.uuid4()))})
    run_binds(conf, db)
    for v in ("2.0", "2.3"):
        body = get(client, arq["uuid"], v=v)
        assert body["state"] == "BindFailed"
        assert "bind_failure_reason" not in body
    body = get(client, arq["uuid"], ADMIN, v="2.4")
    assert "is not the resource provider of any deployable" in body["bind_failure_reason"]
    listed = client.simulate_get(URL, headers={**ADMIN, **version("2.4")}).json["arqs"]
    assert listed[0]["bind_failure_reason"] == body["bind_failure_reason"]


def test_bind_failure_reason_names_hardware_only_to_inventory_readers(client, conf, db, fpga,
                                                                      profile):
    """The reason names hosts and devices: the project's member (and Nova acting for them)
    read that the bind failed, a manager who may read the inventory reads why."""
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node7", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    run_binds(conf, db)
    manager = {**member("project-a"), "X-Roles": "manager,member,reader"}
    full = get(client, arq["uuid"], manager, v="2.4")["bind_failure_reason"]
    assert "node7" in full or "node1" in full, full
    for headers in (NOVA, member("project-a")):
        shown = get(client, arq["uuid"], headers, v="2.4")
        assert shown["state"] == "BindFailed"
        assert shown["bind_failure_reason"] == WITHHELD_REASON
        listed = client.simulate_get(URL, headers={**headers, **version("2.4")}).json["arqs"]
        assert [a["bind_failure_reason"] for a in listed] == [WITHHELD_REASON]


def _fail_reason(client, conf, db, rp, hostname="node1", profile_name="dp-a") -> str:
    arq = create(client, profile_name)[0]
    assert patch(client, {arq["uuid"]: bind_ops(hostname, rp, str(uuid.uuid4()))}
                 ).status_code == 202
    run_binds(conf, db)
    body = get(client, arq["uuid"], ADMIN, v="2.4")
    assert body["state"] == "BindFailed", body
    return body["bind_failure_reason"]


def test_bind_to_another_host_fails(client, conf, db, fpga, profile):
    reason = _fail_reason(client, conf, db, fpga["deployable"]["rp_uuid"], hostname="node2")
    assert "is on host node1, not on node2" in reason
    assert handles_in_use(db) == 0


@pytest.mark.parametrize("column, value, words", [
    ("status", "maintaining", "disabled"),
    ("acc_status", "setup_required", "not ready"),
    ("vanished", True, "no longer reported"),
])
def test_bind_to_unusable_device_fails(client, conf, db, fpga, profile, column, value, words):
    with db.write() as conn:
        conn.execute(update(devices).values({column: value}))
    reason = _fail_reason(client, conf, db, fpga["deployable"]["rp_uuid"])
    assert words in reason
    assert handles_in_use(db) == 0


@pytest.mark.parametrize("group, words", [
    ({"resources:PGPU": "1"}, "offers FPGA; the profile group asks for PGPU"),
    ({"resources:FPGA": "1", "trait:CUSTOM_OTHER": "required"}, "lacks trait CUSTOM_OTHER"),
    ({"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "forbidden"},
     "has trait CUSTOM_FAKE_DEVICE"),
    ({"resources:FPGA": "1", "trait:OWNER_CYBORG": "forbidden"}, "has trait OWNER_CYBORG"),
])
def test_bind_checks_the_profile_group(client, conf, db, fpga, group, words):
    make_profile(client, "dp-x", [group])
    reason = _fail_reason(client, conf, db, fpga["deployable"]["rp_uuid"], profile_name="dp-x")
    assert words in reason
    assert handles_in_use(db) == 0


def test_owner_cyborg_may_be_required_though_no_driver_lists_it(client, conf, db, fpga):
    make_profile(client, "dp-o", [{"resources:FPGA": "1", "trait:OWNER_CYBORG": "required",
                                   "trait:CUSTOM_FAKE_DEVICE": "required"}])
    arq = create(client, "dp-o")[0]
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    run_binds(conf, db)
    assert get(client, arq["uuid"])["state"] == "Bound"


@pytest.mark.parametrize("ops, words", [
    ([{"op": "add", "path": "/hostname", "value": "node1"}], "missing /device_rp_uuid"),
    ([{"op": "replace", "path": "/hostname", "value": "x"}], "'replace' is not supported"),
    ([{"op": "add", "path": "/state", "value": "Bound"}], "'/state' cannot be patched"),
    ([{"op": "add", "path": "/project_id", "value": "p"}], "from microversion 2.1"),
    ([{"op": "add", "path": "/hostname", "value": "n"}, {"op": "remove", "path": "/hostname"},
      ], "mixes add and remove"),
    ([{"op": "add", "path": "/hostname", "value": "n"},
      {"op": "add", "path": "/device_rp_uuid", "value": "not-a-uuid"},
      {"op": "add", "path": "/instance_uuid", "value": str(uuid.UUID(int=1))}], "device_rp_uuid"),
    ([{"op": "add", "path": "/hostname", "value": ""},
      {"op": "add", "path": "/device_rp_uuid", "value": str(uuid.UUID(int=2))},
      {"op": "add", "path": "/instance_uuid", "value": str(uuid.UUID(int=1))}], "hostname"),
    ([], "should be non-empty"),
    ("nope", "array"),
])
def test_bad_patches_are_400_and_change_nothing(client, db, profile, ops, words):
    arq = create(client)[0]
    result = patch(client, {arq["uuid"]: ops})
    assert result.status_code == 400, result.text
    assert words in fault(result)
    assert get(client, arq["uuid"])["state"] == "Initial"


@pytest.mark.parametrize("body", [[], {}, {"not-a-uuid": UNBIND_OPS}, "x"])
def test_patch_body_must_be_keyed_by_uuid(client, body):
    assert patch(client, body).status_code == 400


def test_patch_is_validated_whole_before_anything_changes(client, db, fpga, profile):
    good, other = create(client)[0], create(client)[0]
    rp = fpga["deployable"]["rp_uuid"]
    body = {good["uuid"]: bind_ops("node1", rp, str(uuid.uuid4())),
            other["uuid"]: [{"op": "add", "path": "/hostname", "value": "node1"}]}
    assert patch(client, body).status_code == 400
    body = {good["uuid"]: bind_ops("node1", rp, str(uuid.uuid4())),
            str(uuid.uuid4()): bind_ops("node1", rp, str(uuid.uuid4()))}
    assert patch(client, body).status_code == 404
    assert get(client, good["uuid"])["state"] == "Initial"
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one() == 0


def test_patch_limit_names_the_option(client, conf, db, profile):
    conf.set_override("max_patch_operations", 2, group="api")
    arqs = [create(client)[0] for _ in range(3)]
    body = {a["uuid"]: UNBIND_OPS for a in arqs}
    result = patch(client, body)
    assert result.status_code == 400
    assert "max_patch_operations" in fault(result)


def test_bind_twice_is_409(client, conf, db, fpga, profile):
    arq = create(client)[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))
    assert patch(client, {arq["uuid"]: ops}).status_code == 202
    result = patch(client, {arq["uuid"]: ops})
    assert result.status_code == 409
    assert "BindStarted" in fault(result)
    run_binds(conf, db)
    assert patch(client, {arq["uuid"]: ops}).status_code == 409


def test_bind_and_unbind_need_the_service_role(client, db, fpga, profile):
    arq = create(client)[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))
    for body in ({arq["uuid"]: ops}, {arq["uuid"]: UNBIND_OPS}):
        result = patch(client, body, headers=member("project-a"))
        assert result.status_code == 403
        assert fault(result) == ("This operation requires a service token. Use the Compute "
                                 "API to manage instance accelerators.")
    assert get(client, arq["uuid"])["state"] == "Initial"


def test_service_requirement_can_be_switched_off(client, conf, db, fpga, profile):
    conf.set_override("require_service_token_for_bind", False, group="api")
    arq = create(client)[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))
    assert patch(client, {arq["uuid"]: ops}, headers=member("project-a")).status_code == 202


def test_configured_service_role(client, conf, db, fpga, profile):
    conf.set_override("service_role", "nova-service", group="api")
    arq = create(client)[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))
    assert patch(client, {arq["uuid"]: ops}).status_code == 403
    headers = {**member("project-a"), "X-Service-Roles": "nova-service"}
    assert patch(client, {arq["uuid"]: ops}, headers=headers).status_code == 202


def test_cannot_bind_another_projects_arq(client, db, fpga, profile):
    theirs = create(client, headers=member("project-b"))[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4()))
    assert patch(client, {theirs["uuid"]: ops}).status_code == 404
    assert get(client, theirs["uuid"], headers=ADMIN)["state"] == "Initial"


def test_project_id_in_bind_admin_only_from_2_1(client, conf, db, fpga, profile):
    arq = create(client)[0]
    ops = bind_ops("node1", fpga["deployable"]["rp_uuid"], str(uuid.uuid4())) + [
        {"op": "add", "path": "/project_id", "value": "project-z"}]
    assert patch(client, {arq["uuid"]: ops}, extra_headers=version("2.1")).status_code == 403
    assert patch(client, {arq["uuid"]: ops}, headers=SERVICE).status_code == 400  # 2.0
    result = patch(client, {arq["uuid"]: ops}, headers=SERVICE, extra_headers=version("2.1"))
    assert result.status_code == 202
    assert get(client, arq["uuid"], headers=ADMIN)["project_id"] == "project-z"


# ---------------------------------------------------------------------------- unbind

def test_unbind_releases_the_handle(client, conf, db, fpga, profile):
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    run_binds(conf, db)
    assert handles_in_use(db) == 1
    assert patch(client, {arq["uuid"]: UNBIND_OPS}).status_code == 202
    body = get(client, arq["uuid"])
    assert body["state"] == "Unbound"
    assert (body["hostname"], body["device_rp_uuid"], body["instance_uuid"],
            body["attach_handle_uuid"]) == (None,) * 4
    assert handles_in_use(db) == 0
    # Idempotent, and an Unbound ARQ can be bound again.
    assert patch(client, {arq["uuid"]: UNBIND_OPS}).status_code == 202
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    run_binds(conf, db)
    assert get(client, arq["uuid"])["state"] == "Bound"


def test_unbind_while_bind_in_flight_wins(client, conf, db, fpga, profile):
    """The worker claimed the job, the ARQ is unbound before it commits: no handle taken."""
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    from acceld.db import bind_jobs as jobs_db

    w = worker(conf, db)
    (job,) = jobs_db.claim(db, jobs_db.PENDING, "test-token", 10, 60)
    assert patch(client, {arq["uuid"]: UNBIND_OPS}).status_code == 202
    assert w._bind(job, "test-token") is False
    assert get(client, arq["uuid"])["state"] == "Unbound"
    assert handles_in_use(db) == 0


def test_unbind_of_unbind_failed_is_409(client, db, profile):
    arq = create(client)[0]
    with db.write() as conn:
        conn.execute(update(accelerator_requests).values(state="UnbindFailed"))
    result = patch(client, {arq["uuid"]: UNBIND_OPS})
    assert result.status_code == 409


# ---------------------------------------------------------------------------- 423

def test_resolved_poll_is_423_while_binding(client, conf, db, fpga, profile):
    arq = create(client)[0]
    instance = str(uuid.uuid4())
    query = f"instance={instance}&bind_state=resolved"
    assert client.simulate_get(URL, query_string=query, headers=NOVA).json == {"arqs": []}
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"], instance)})
    result = client.simulate_get(URL, query_string=query, headers=NOVA)
    assert result.status_code == 423
    assert result.content == b""
    # Without bind_state, or without instance, the list comes whatever the states.
    assert client.simulate_get(URL, query_string=f"instance={instance}",
                               headers=NOVA).status_code == 200
    assert client.simulate_get(URL, query_string="bind_state=resolved",
                               headers=NOVA).status_code == 200
    run_binds(conf, db)
    result = client.simulate_get(URL, query_string=query, headers=NOVA)
    assert result.status_code == 200
    assert [a["state"] for a in result.json["arqs"]] == ["Bound"]


# ---------------------------------------------------------------------------- delete

def _bound_arq(client, conf, db, fpga, instance=None) -> dict:
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         instance or str(uuid.uuid4()))})
    run_binds(conf, db)
    return get(client, arq["uuid"])


def test_delete_by_instance_unbinds_and_is_idempotent(client, conf, db, fpga, profile):
    instance = str(uuid.uuid4())
    _bound_arq(client, conf, db, fpga, instance)
    _bound_arq(client, conf, db, fpga, instance)
    assert handles_in_use(db) == 2
    result = client.simulate_delete(URL, query_string=f"instance={instance}", headers=NOVA)
    assert result.status_code == 204
    assert handles_in_use(db) == 0
    assert arq_count(db) == 0
    assert client.simulate_delete(URL, query_string=f"instance={instance}",
                                  headers=NOVA).status_code == 204


def test_delete_by_instance_needs_the_service_role(client, conf, db, fpga, profile):
    instance = str(uuid.uuid4())
    _bound_arq(client, conf, db, fpga, instance)
    result = client.simulate_delete(URL, query_string=f"instance={instance}",
                                    headers=member("project-a"))
    assert result.status_code == 403
    assert "service token" in fault(result)
    assert arq_count(db) == 1


def test_delete_by_instance_only_touches_own_project(client, conf, db, fpga, profile):
    instance = str(uuid.uuid4())
    _bound_arq(client, conf, db, fpga, instance)
    other = {**member("project-b"), "X-Service-Roles": "service"}
    assert client.simulate_delete(URL, query_string=f"instance={instance}",
                                  headers=other).status_code == 204
    assert arq_count(db) == 1 and handles_in_use(db) == 1


def test_delete_by_uuids_all_or_nothing(client, db, profile):
    arqs = [create(client)[0] for _ in range(2)]
    uuids = ",".join([a["uuid"] for a in arqs] + [str(uuid.uuid4())])
    assert client.simulate_delete(URL, query_string=f"arqs={uuids}",
                                  headers=NOVA).status_code == 404
    assert arq_count(db) == 2
    uuids = ",".join(a["uuid"] for a in arqs)
    result = client.simulate_delete(URL, query_string=f"arqs={uuids}",
                                    headers=member("project-a"))
    assert result.status_code == 204
    assert arq_count(db) == 0


def test_the_service_role_counts_only_from_the_service_token(client, db, fpga, profile):
    """A user holding 'service' on their own token (X-Roles) is not Nova."""
    arq = create(client)[0]
    own_role = {**member("project-a"), "X-Roles": "service,member,reader"}
    result = patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                                  str(uuid.uuid4()))}, headers=own_role)
    assert result.status_code == 403
    assert "service token" in fault(result)
    assert get(client, arq["uuid"])["state"] == "Initial"


def test_delete_of_a_failed_arq_naming_its_instance_needs_the_service_role(client, conf, db,
                                                                            profile):
    """As upstream: Nova cleans up a BindFailed ARQ that still names its instance."""
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", str(uuid.uuid4()), str(uuid.uuid4()))})
    run_binds(conf, db)
    assert get(client, arq["uuid"])["state"] == "BindFailed"
    result = client.simulate_delete(f"{URL}/{arq['uuid']}", headers=member("project-a"))
    assert result.status_code == 403
    assert "service token" in fault(result)
    assert arq_count(db) == 1
    assert client.simulate_delete(f"{URL}/{arq['uuid']}", headers=NOVA).status_code == 204
    assert arq_count(db) == 0


def test_delete_of_a_bound_arq_needs_the_service_role(client, conf, db, fpga, profile):
    bound = _bound_arq(client, conf, db, fpga)
    for how in ({"path": f"{URL}/{bound['uuid']}"},
                {"path": URL, "query_string": f"arqs={bound['uuid']}"}):
        result = client.simulate_delete(headers=member("project-a"), **how)
        assert result.status_code == 403
        assert "service token" in fault(result)
    assert handles_in_use(db) == 1
    result = client.simulate_delete(f"{URL}/{bound['uuid']}", headers=NOVA)
    assert result.status_code == 204
    assert handles_in_use(db) == 0 and arq_count(db) == 0


def test_delete_by_uuid_path_as_the_sdk_sends_it(client, db, profile):
    arq = create(client)[0]
    assert client.simulate_delete(f"{URL}/{arq['uuid']}", headers=NOVA).status_code == 204
    assert client.simulate_delete(f"{URL}/{arq['uuid']}", headers=NOVA).status_code == 404
    assert client.simulate_delete(f"{URL}/not-a-uuid", headers=NOVA).status_code == 404


def test_delete_of_another_projects_arq_is_404(client, db, profile):
    theirs = create(client, headers=member("project-b"))[0]
    assert client.simulate_delete(f"{URL}/{theirs['uuid']}", headers=NOVA).status_code == 404
    assert client.simulate_delete(URL, query_string=f"arqs={theirs['uuid']}",
                                  headers=NOVA).status_code == 404
    assert arq_count(db) == 1


@pytest.mark.parametrize("query, words", [
    ("", "exactly one"),
    ("arqs=8aa41943-0bd2-41d4-804e-dd0f3fb47332&instance=d15f6ce5-40fb-4acb-aad7-b713b5c33826",
     "exactly one"),
    ("instance=abc", "instance"),
    ("arqs=abc", "arqs"),
    ("arqs=,", "names no"),
    ("value=x", "value"),
])
def test_bad_deletes_are_400(client, query, words):
    result = client.simulate_delete(URL, query_string=query, headers=NOVA)
    assert result.status_code == 400
    assert words in fault(result)


def test_delete_limit_names_the_option(client, conf):
    conf.set_override("max_arqs_per_delete", 2, group="api")
    uuids = ",".join(str(uuid.uuid4()) for _ in range(3))
    result = client.simulate_delete(URL, query_string=f"arqs={uuids}", headers=NOVA)
    assert result.status_code == 400
    assert "max_arqs_per_delete" in fault(result)


def test_delete_while_bind_in_flight_leaks_nothing(client, conf, db, fpga, profile):
    arq = create(client)[0]
    patch(client, {arq["uuid"]: bind_ops("node1", fpga["deployable"]["rp_uuid"],
                                         str(uuid.uuid4()))})
    from acceld.db import bind_jobs as jobs_db

    (job,) = jobs_db.claim(db, jobs_db.PENDING, "test-token", 10, 60)
    assert client.simulate_delete(f"{URL}/{arq['uuid']}", headers=NOVA).status_code == 204
    assert worker(conf, db)._bind(job, "test-token") is False
    assert handles_in_use(db) == 0 and arq_count(db) == 0


# ---------------------------------------------------------------------------- profiles

def test_profile_in_use_cannot_be_deleted(client, db, profile):
    arq = create(client)[0]
    result = client.simulate_delete(f"{DP_URL}/dp-a", headers=ADMIN)
    assert result.status_code == 409
    assert "in use" in fault(result)
    assert client.simulate_delete(f"{URL}/{arq['uuid']}", headers=NOVA).status_code == 204
    assert client.simulate_delete(f"{DP_URL}/dp-a", headers=ADMIN).status_code == 204


def test_attach_info_is_sent_as_stored(client, conf, db, fpga, profile):
    with db.write() as conn:
        conn.execute(update(attach_handles).values(attach_info=orjson.dumps(
            {"domain": "0000", "bus": "af", "device": "00", "function": "1"}).decode()))
    bound = _bound_arq(client, conf, db, fpga)
    assert bound["attach_handle_info"] == {"domain": "0000", "bus": "af", "device": "00",
                                           "function": "1"}


def test_nul_in_profile_name_or_project_header_is_400(client, db):
    """PostgreSQL refuses NUL in text; both were 500s there. (In noauth mode the client
    chooses X-Project-Id.)"""
    make_profile(client)
    result = client.simulate_post(URL, json={"device_profile_name": "dp-a\u0000"},
                                  headers=member("project-a"))
    assert result.status_code == 400
    assert "NUL" in fault(result)
    for method in ("GET", "POST"):
        result = client.simulate_request(method, URL, json={"device_profile_name": "dp-a"},
                                         headers=member("project-a\u0000"))
        assert result.status_code == 400, result.text
    assert client.simulate_get(URL, headers=ADMIN).json["arqs"] == []
