"""Nova's own Cyborg client module (nova.accelerator.cyborg, Nova 34 in .nova/venv) against
acceld behind a real Keystone, configured as docs/nova.md says: [cyborg] names acceld,
[service_user] makes Nova add its service token to the user's. With it Nova's whole
sequence works (profile groups, create, bind, list by instance, delete by instance);
without it the bind is refused and changes nothing; with [api]
require_service_token_for_bind = false the user's token alone binds (the trade-off)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests

from tests.support import inventory, keystone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NOVA_PYTHON = REPO / ".nova" / "venv" / "bin" / "python"
CALLS = REPO / "tests" / "support" / "nova_cyborg_calls.py"
PROFILE = "nova-client-dp"


@pytest.fixture(scope="module", autouse=True)
def _nova_installed() -> None:
    if not NOVA_PYTHON.exists():
        pytest.skip("Nova is not installed in .nova/venv: `make nova` installs it (about 40 s "
                    "and 400 MB, once)")


def nova_conf(path: Path, ks: keystone.Keystone, service_user: bool) -> Path:
    """nova.conf as docs/nova.md gives it (endpoint_override: this Keystone's catalog
    names acceld too, but the test's acceld is found without a region to match)."""
    text = f"[cyborg]\nendpoint_override = {ks.api_url}\nvalid_interfaces = internal,public\n"
    if service_user:
        text += (f"[service_user]\nsend_service_user_token = true\nauth_type = password\n"
                 f"auth_url = {ks.url}/v3\nusername = nova\npassword = {keystone.PASSWORD}\n"
                 "user_domain_id = default\nproject_name = service\n"
                 "project_domain_id = default\n")
    path.write_text(text)
    return path


def run_nova(ks: keystone.Keystone, conf: Path, rp: str, instance: str) -> dict:
    """Nova's calls for one instance of demo-member, as nova-conductor/compute make them."""
    request = conf.with_suffix(".json")
    request.write_text(json.dumps({
        "token": ks.token("demo-member"), "user_id": "demo-member",
        "project_id": ks.project_id("demo"), "profile": PROFILE, "host": "node1", "rp": rp,
        "instance": instance}))
    # -I: the script's own directory (tests/support, with a nova.py) is not on the path.
    done = subprocess.run([str(NOVA_PYTHON), "-I", str(CALLS), str(conf), str(request)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def prepare(api: dict, ks: keystone.Keystone, name: str) -> str:
    """A deployable with two free handles on node1 and the profile; the provider's uuid."""
    with api["db"].write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        deployable = inventory.add_deployable(conn, device["id"], name=name)
        inventory.add_attach_handles(conn, deployable["id"], 2)
    made = requests.post(api["base"] + "/accelerator/v2/device_profiles", timeout=30,
                         headers={"X-Auth-Token": ks.token("demo-admin")},
                         json=[{"name": PROFILE, "groups": [{"resources:FPGA": "1"}]}])
    assert made.status_code in (201, 409), made.text
    return deployable["rp_uuid"]


def arq_states(api: dict, ks: keystone.Keystone, uuids: list[str]) -> dict[str, tuple]:
    out = {}
    for arq in uuids:
        got = requests.get(f"{api['base']}/accelerator/v2/accelerator_requests/{arq}",
                           headers={"X-Auth-Token": ks.token("demo-reader")}, timeout=30)
        out[arq] = (got.json()["state"], got.json()["instance_uuid"]) \
            if got.status_code == 200 else got.status_code
    return out


@pytest.fixture(scope="module")
def api(ks, tmp_path_factory) -> Iterator[dict]:
    with keystone.acceld_api(ks, tmp_path_factory.mktemp("acceld")) as client:
        yield client


def test_nova_binds_with_its_service_token(api, ks, tmp_path) -> None:
    rp = prepare(api, ks, "node1_nova_a")
    instance = str(uuid.uuid4())
    out = run_nova(ks, nova_conf(tmp_path / "nova.conf", ks, True), rp, instance)
    assert out["groups"] == [{"resources:FPGA": "1"}]
    assert len(out["created"]) == 1
    assert out["bind"] == "ok"
    assert [a["uuid"] for a in out["for_instance"]] == out["created"]
    assert out["for_instance"][0]["state"] in ("BindStarted", "Bound")
    assert out["delete_by_instance"] == "ok"
    assert arq_states(api, ks, out["created"]) == {out["created"][0]: 404}


def test_nova_without_a_service_token_cannot_bind(api, ks, tmp_path) -> None:
    rp = prepare(api, ks, "node1_nova_b")
    out = run_nova(ks, nova_conf(tmp_path / "nova.conf", ks, False), rp, str(uuid.uuid4()))
    assert len(out["created"]) == 1
    assert out["bind"]["error"].startswith("AcceleratorRequestBindingFailed")
    assert "403" in out["bind"]["error"] or "service token" in out["bind"]["error"]
    assert arq_states(api, ks, out["created"]) == {out["created"][0]: ("Initial", None)}


def test_without_require_service_token_the_users_token_binds(tmp_path) -> None:
    """The trade-off of docs/nova.md: a Nova without [service_user] works, and so would
    any member of the project."""
    ks = keystone.start(tmp_path / "keystone")
    (tmp_path / "acceld").mkdir()
    try:
        with keystone.acceld_api(ks, tmp_path / "acceld",
                                 "[api]\nrequire_service_token_for_bind = false\n") as api:
            rp = prepare(api, ks, "node1_nova_c")
            out = run_nova(ks, nova_conf(tmp_path / "nova.conf", ks, False), rp,
                           str(uuid.uuid4()))
            assert out["bind"] == "ok"
            assert out["delete_by_instance"] == "ok"
    finally:
        ks.stop()
