"""Nova's exact Cyborg requests, replayed over HTTP against ``acceld all``.

Shapes follow Nova's Cyborg client (nova/accelerator/cyborg.py): a keystoneauth
adapter for service type ``accelerator`` (so JSON bodies, ``Accept:
application/json`` and no microversion header), identity as keystonemiddleware
hands it on for a user token plus Nova's service token. Each step checks the
status and the fields Nova reads, nothing more; the end-to-end flow with Nova's
events is covered in the ARQ suite.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
import requests

from tests.compat.conftest import HOSTNAME, unique

pytestmark = pytest.mark.integration

PROJECT = "nova-project"
# A user token for PROJECT plus Nova's service token, as keystonemiddleware passes them on.
NOVA = {
    "Accept": "application/json",
    "User-Agent": "nova-compute keystoneauth1/5.6.0 python-requests/2.31.0 CPython/3.11.7",
    "X-User-Id": "nova-user",
    "X-Project-Id": PROJECT,
    "X-Roles": "member,reader",
    "X-Service-Roles": "service",
}
RESOLVED = {"Bound", "BindFailed", "Deleting"}
ARQ_FIELDS = {"uuid", "state", "device_profile_name", "device_profile_group_id", "hostname",
              "device_rp_uuid", "instance_uuid", "attach_handle_type", "attach_handle_info"}


@pytest.fixture(scope="module")
def nova(acceld_all) -> requests.Session:
    session = requests.Session()
    session.headers.update(NOVA)
    return session


@pytest.fixture(scope="module")
def profile(acceld_all, http) -> str:
    """An operator-made profile: one group asking for one FPGA with the fake driver's trait."""
    name = unique("nova-dp")
    resp = http.post(f"{acceld_all.url}/device_profiles",
                     json=[{"name": name, "groups": [{"resources:FPGA": "1",
                                                      "trait:CUSTOM_FAKE_DEVICE": "required"}]}])
    assert resp.status_code == 201, resp.text
    return name


def _no_version_header(resp: requests.Response) -> None:
    """Nova sends no microversion: acceld must answer at 2.0."""
    assert "OpenStack-API-Version" not in resp.request.headers
    assert resp.headers["OpenStack-API-Version"] == "accelerator 2.0"


def _create_arqs(acceld_all, nova, profile: str) -> list[dict]:
    resp = nova.post(f"{acceld_all.url}/accelerator_requests",
                     json={"device_profile_name": profile})
    assert resp.status_code == 201, resp.text
    _no_version_header(resp)
    arqs = resp.json()["arqs"]
    assert len(arqs) == 1
    assert ARQ_FIELDS <= set(arqs[0])
    assert arqs[0]["state"] == "Initial"
    assert arqs[0]["device_profile_group_id"] == 0
    return arqs


def _bind_patch(arqs: list[dict], rp_uuid: str, instance: str) -> dict:
    return {arq["uuid"]: [{"path": "/hostname", "op": "add", "value": HOSTNAME},
                          {"path": "/device_rp_uuid", "op": "add", "value": rp_uuid},
                          {"path": "/instance_uuid", "op": "add", "value": instance}]
            for arq in arqs}


def _poll_resolved(acceld_all, nova, instance: str, timeout: float = 20.0) -> tuple[list[int], dict]:
    """GET ?instance=&bind_state=resolved until 200, as Nova's compute manager waits."""
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = nova.get(f"{acceld_all.url}/accelerator_requests",
                        params={"instance": instance, "bind_state": "resolved"})
        statuses.append(resp.status_code)
        if resp.status_code == 423:
            assert resp.content == b"" or resp.headers.get("Content-Type", "").startswith(
                "application/json"), resp.text
        elif resp.status_code == 200:
            return statuses, resp.json()
        else:
            pytest.fail(f"resolved poll answered {resp.status_code}: {resp.text}")
        time.sleep(0.1)
    pytest.fail(f"ARQs of {instance} not resolved within {timeout}s: statuses {statuses[-5:]}")


def test_profile_lookup_by_name_query(acceld_all, nova, profile) -> None:
    resp = nova.get(f"{acceld_all.url}/device_profiles", params={"name": profile})
    assert resp.status_code == 200, resp.text
    _no_version_header(resp)
    profiles = resp.json()["device_profiles"]
    assert [p["name"] for p in profiles] == [profile]  # Nova requires exactly one
    assert profiles[0]["groups"] == [{"resources:FPGA": "1",
                                      "trait:CUSTOM_FAKE_DEVICE": "required"}]


def test_unknown_profile_lookup_is_an_empty_list(acceld_all, nova) -> None:
    resp = nova.get(f"{acceld_all.url}/device_profiles", params={"name": unique("absent")})
    assert resp.status_code == 200
    assert resp.json() == {"device_profiles": []}


def test_create_for_unknown_profile_is_404(acceld_all, nova) -> None:
    resp = nova.post(f"{acceld_all.url}/accelerator_requests",
                     json={"device_profile_name": unique("absent")})
    assert resp.status_code == 404, resp.text
    assert "error_message" in resp.json()


def test_full_sequence_binds_lists_and_deletes(acceld_all, nova, profile,
                                               fake_deployable) -> None:
    """Boot: lookup, POST, one collection PATCH, resolved poll, list; teardown: DELETE ?instance=."""
    instance = str(uuid.uuid4())
    arqs = _create_arqs(acceld_all, nova, profile)

    resp = nova.patch(f"{acceld_all.url}/accelerator_requests",
                      json=_bind_patch(arqs, fake_deployable["rp_uuid"], instance))
    assert resp.status_code == 202, resp.text
    assert resp.content == b""

    statuses, body = _poll_resolved(acceld_all, nova, instance)
    assert set(statuses[:-1]) <= {423}
    resolved = body["arqs"]
    assert [a["uuid"] for a in resolved] == [arqs[0]["uuid"]]
    assert resolved[0]["state"] == "Bound", resolved[0]

    # What Nova reads to build the VM: the PCI attach handle of each bound ARQ.
    resp = nova.get(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 200, resp.text
    _no_version_header(resp)
    (arq,) = resp.json()["arqs"]
    assert arq["state"] == "Bound"
    assert arq["instance_uuid"] == instance
    assert arq["hostname"] == HOSTNAME
    assert arq["device_rp_uuid"] == fake_deployable["rp_uuid"]
    assert arq["attach_handle_type"] == "TEST_PCI" or arq["attach_handle_type"] == "PCI"
    assert arq["attach_handle_info"] and all(isinstance(v, str)
                                             for v in arq["attach_handle_info"].values())
    assert arq["attach_handle_uuid"]

    resp = nova.delete(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 204, resp.text
    resp = nova.get(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 200
    assert resp.json()["arqs"] == []
    # Idempotent: Nova deletes again on a retried teardown.
    resp = nova.delete(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 204, resp.text


def test_resolved_poll_answers_423_while_a_bind_is_in_flight(acceld_all, nova, profile,
                                                             fake_deployable) -> None:
    """With the conductor paused (SIGSTOP by PID) the bind cannot finish: 423, then 200."""
    conductor = acceld_all.child_pid("conductor")
    assert conductor, "the all-in-one's conductor process was not found"
    instance = str(uuid.uuid4())
    arqs = _create_arqs(acceld_all, nova, profile)
    os.kill(conductor, signal.SIGSTOP)
    try:
        resp = nova.patch(f"{acceld_all.url}/accelerator_requests",
                          json=_bind_patch(arqs, fake_deployable["rp_uuid"], instance),
                          timeout=30)
        assert resp.status_code == 202, resp.text
        resp = nova.get(f"{acceld_all.url}/accelerator_requests",
                        params={"instance": instance, "bind_state": "resolved"})
        assert resp.status_code == 423, resp.text
        # Without bind_state Nova still gets the list, whatever the states.
        resp = nova.get(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
        assert resp.status_code == 200
        assert [a["state"] for a in resp.json()["arqs"]] == ["BindStarted"]
    finally:
        os.kill(conductor, signal.SIGCONT)
    statuses, body = _poll_resolved(acceld_all, nova, instance)
    assert statuses[-1] == 200
    assert [a["state"] for a in body["arqs"]] == ["Bound"]
    resp = nova.delete(f"{acceld_all.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 204


def test_failed_bind_cleanup_by_arq_uuids(acceld_all, nova, profile) -> None:
    """A bind to a provider that is no deployable resolves BindFailed; Nova deletes ?arqs=."""
    instance = str(uuid.uuid4())
    arqs = _create_arqs(acceld_all, nova, profile)
    resp = nova.patch(f"{acceld_all.url}/accelerator_requests",
                      json=_bind_patch(arqs, str(uuid.uuid4()), instance))
    # Refused up front or failed asynchronously: either way never Bound.
    if resp.status_code == 202:
        _, body = _poll_resolved(acceld_all, nova, instance)
        assert [a["state"] for a in body["arqs"]] == ["BindFailed"]
    else:
        assert resp.status_code in (400, 404, 409), resp.text
    resp = nova.delete(f"{acceld_all.url}/accelerator_requests",
                       params={"arqs": ",".join(a["uuid"] for a in arqs)})
    assert resp.status_code == 204, resp.text
    resp = nova.get(f"{acceld_all.url}/accelerator_requests/{arqs[0]['uuid']}")
    assert resp.status_code == 404


@pytest.mark.parametrize("params", [
    {"instance": "not-a-uuid"},
    {"instance": str(uuid.UUID(int=1)), "bind_state": "started"},
])
def test_bad_list_queries_are_400(acceld_all, nova, params) -> None:
    resp = nova.get(f"{acceld_all.url}/accelerator_requests", params=params)
    assert resp.status_code == 400, resp.text


def test_delete_needs_exactly_one_selector(acceld_all, nova) -> None:
    resp = nova.delete(f"{acceld_all.url}/accelerator_requests")
    assert resp.status_code == 400, resp.text
    resp = nova.delete(f"{acceld_all.url}/accelerator_requests",
                       params={"instance": str(uuid.uuid4()), "arqs": str(uuid.uuid4())})
    assert resp.status_code == 400, resp.text
