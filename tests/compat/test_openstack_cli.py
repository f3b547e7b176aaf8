"""The ``openstack accelerator`` CLI (python-openstackclient with python-cyborgclient installed).

Each command runs as its own process, the way an operator types it:
``openstack --os-auth-type none --os-endpoint <url> accelerator ...``. ``arq bind``
resolves its server through Nova and ``deployable program`` checks its image in
Glance, so those two run with a clouds.yaml that adds a minimal compute and
image endpoint (tests/compat/minimal_cloud.py) beside the same accelerator one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.compat.conftest import BITSTREAM_ID, HOSTNAME, unique
from tests.compat.minimal_cloud import MinimalCloud

pytestmark = pytest.mark.integration

OPENSTACK = os.path.join(os.path.dirname(sys.executable), "openstack")


class Cli:
    def __init__(self, url: str, clouds_yaml: str) -> None:
        self.url = url
        self.clouds_yaml = clouds_yaml

    def run(self, *args: str, cloud: bool = False, check: bool = True,
            version: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
        if cloud:
            env["OS_CLIENT_CONFIG_FILE"] = self.clouds_yaml
            argv = [OPENSTACK, "--os-cloud", "acceld"]
        else:
            argv = [OPENSTACK, "--os-auth-type", "none", "--os-endpoint", self.url]
        if version:
            argv += ["--os-accelerator-api-version", version]
        result = subprocess.run([*argv, *args], env=env, capture_output=True, text=True,
                                timeout=120)
        if check:
            assert result.returncode == 0, (
                f"openstack {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}")
        return result

    def json(self, *args: str, **kwargs) -> object:
        return json.loads(self.run(*args, "-f", "json", **kwargs).stdout)


@pytest.fixture(scope="module")
def cloud() -> MinimalCloud:
    minimal = MinimalCloud().start()
    minimal.add_image(BITSTREAM_ID)
    yield minimal
    minimal.stop()


@pytest.fixture(scope="module")
def cli(acceld_all, cloud, tmp_path_factory) -> Cli:
    path = tmp_path_factory.mktemp("osc") / "clouds.yaml"
    path.write_text(f"""clouds:
  acceld:
    auth_type: none
    auth:
      endpoint: {acceld_all.url}
    compute_endpoint_override: {cloud.compute_url}
    image_endpoint_override: {cloud.image_url}
""")
    return Cli(acceld_all.url, str(path))


@pytest.fixture(scope="module")
def profile(cli) -> str:
    name = unique("cli-dp")
    cli.json("accelerator", "device", "profile", "create", name,
             "--group", "resources:FPGA=1,trait:CUSTOM_FAKE_DEVICE=required")
    return name


def _wait_state(cli: Cli, arq: str, states: set[str], timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        shown = cli.json("accelerator", "arq", "show", arq)
        if shown["state"] in states or time.monotonic() > deadline:
            return shown
        time.sleep(0.2)


# ---- device profiles -------------------------------------------------------------------------

def test_device_profile_commands(cli) -> None:
    name = unique("cli-dp")
    created = cli.json("accelerator", "device", "profile", "create", name,
                       "--group", "resources:FPGA=1,trait:CUSTOM_FAKE_DEVICE=required",
                       "--group", "resources:PGPU=2", "--description", "from the CLI")
    assert created["name"] == name
    assert created["groups"] == [{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"},
                                 {"resources:PGPU": "2"}]
    assert created["description"] == "from the CLI"

    listed = cli.json("accelerator", "device", "profile", "list", "--long")
    assert {p["name"]: p["uuid"] for p in listed}[name] == created["uuid"]
    assert cli.json("accelerator", "device", "profile", "show", created["uuid"])["name"] == name
    # By name needs 2.2, which the CLI asks for when told to.
    assert cli.json("accelerator", "device", "profile", "show", name,
                    version="2.2")["uuid"] == created["uuid"]

    cli.run("accelerator", "device", "profile", "delete", name)
    gone = cli.run("accelerator", "device", "profile", "show", created["uuid"], check=False)
    assert gone.returncode != 0
    assert "could not be found" in gone.stderr or "No DeviceProfile" in gone.stderr


def test_device_profile_errors_reach_the_user(cli, profile) -> None:
    dup = cli.run("accelerator", "device", "profile", "create", profile,
                  "--group", "resources:FPGA=1", check=False)
    assert dup.returncode != 0
    assert "already exists" in dup.stderr
    bad = cli.run("accelerator", "device", "profile", "create", unique("cli-bad"),
                  "--group", "resources:FPGA=-1", check=False)
    assert bad.returncode != 0
    assert "groups" in bad.stderr
    missing = cli.run("accelerator", "device", "profile", "delete", str(uuid.uuid4()),
                      check=False)
    assert missing.returncode != 0


# ---- accelerator requests -------------------------------------------------------------------

def test_arq_create_list_show_delete(cli, profile) -> None:
    arq = cli.json("accelerator", "arq", "create", profile)
    assert arq["state"] == "Initial"
    assert arq["device_profile_name"] == profile
    listed = cli.json("accelerator", "arq", "list", "--long")
    assert arq["uuid"] in {a["uuid"] for a in listed}
    shown = cli.json("accelerator", "arq", "show", arq["uuid"])
    assert (shown["uuid"], shown["state"]) == (arq["uuid"], "Initial")
    cli.run("accelerator", "arq", "delete", arq["uuid"])
    assert cli.run("accelerator", "arq", "show", arq["uuid"], check=False).returncode != 0
    again = cli.run("accelerator", "arq", "delete", arq["uuid"], check=False)
    assert again.returncode != 0


def test_arq_create_for_unknown_profile_fails(cli) -> None:
    result = cli.run("accelerator", "arq", "create", unique("absent"), check=False)
    assert result.returncode != 0


def test_arq_bind_and_unbind(cli, cloud, profile, fake_deployable) -> None:
    """``arq bind`` finds the server in (minimal) Nova, then PATCHes the ARQ by uuid."""
    server = str(uuid.uuid4())
    cloud.add_server(server)
    arq = cli.json("accelerator", "arq", "create", profile)
    cli.json("accelerator", "arq", "bind", arq["uuid"], HOSTNAME, server,
             fake_deployable["rp_uuid"], cloud=True)
    assert ("GET", f"/compute/v2.1/servers/{server}") in cloud.requests
    bound = _wait_state(cli, arq["uuid"], {"Bound", "BindFailed"})
    assert bound["state"] == "Bound"
    assert bound["instance_uuid"] == server
    assert bound["hostname"] == HOSTNAME
    assert bound["device_rp_uuid"] == fake_deployable["rp_uuid"]
    assert bound["attach_handle_type"]

    cli.json("accelerator", "arq", "unbind", arq["uuid"])
    unbound = _wait_state(cli, arq["uuid"], {"Unbound", "UnbindFailed"})
    assert unbound["state"] == "Unbound"
    assert not unbound["instance_uuid"]
    cli.run("accelerator", "arq", "delete", arq["uuid"])


def test_arq_bind_to_unknown_server_fails_before_patching(cli, cloud, profile,
                                                          fake_deployable) -> None:
    arq = cli.json("accelerator", "arq", "create", profile)
    result = cli.run("accelerator", "arq", "bind", arq["uuid"], HOSTNAME, str(uuid.uuid4()),
                     fake_deployable["rp_uuid"], cloud=True, check=False)
    assert result.returncode != 0
    assert cli.json("accelerator", "arq", "show", arq["uuid"])["state"] == "Initial"
    cli.run("accelerator", "arq", "delete", arq["uuid"])


# ---- devices ---------------------------------------------------------------------------------

def test_device_list_show_disable_enable(cli, fake_device) -> None:
    listed = cli.json("accelerator", "device", "list", "--long")
    assert fake_device["uuid"] in {d["uuid"] for d in listed}
    shown = cli.json("accelerator", "device", "show", fake_device["uuid"])
    assert shown["hostname"] == HOSTNAME
    assert shown["type"] == "FPGA"
    try:
        cli.run("accelerator", "device", "disable", fake_device["uuid"])
        shown = cli.json("accelerator", "device", "show", fake_device["uuid"], version="2.3")
        assert shown["status"] == "maintaining"
    finally:
        cli.run("accelerator", "device", "enable", fake_device["uuid"])
    shown = cli.json("accelerator", "device", "show", fake_device["uuid"], version="2.3")
    assert shown["status"] == "enabled"
    missing = cli.run("accelerator", "device", "show", str(uuid.uuid4()), check=False)
    assert missing.returncode != 0


# ---- deployables -----------------------------------------------------------------------------

def test_deployable_list_and_show(cli, fake_deployable) -> None:
    listed = {d["uuid"]: d for d in cli.json("accelerator", "deployable", "list", "--long")}
    assert listed[fake_deployable["uuid"]]["num_accelerators"] == \
        fake_deployable["num_accelerators"]
    assert listed[fake_deployable["uuid"]]["device_id"] == fake_deployable["device_id"]
    shown = cli.json("accelerator", "deployable", "show", fake_deployable["uuid"])
    assert (shown["uuid"], shown["name"]) == (fake_deployable["uuid"], fake_deployable["name"])
    missing = cli.run("accelerator", "deployable", "show", str(uuid.uuid4()), check=False)
    assert missing.returncode != 0


def test_deployable_program(cli, cloud, acceld_all, http, fake_deployable) -> None:
    """``deployable program`` checks the image in (minimal) Glance, then PATCHes .../program."""
    cli.json("accelerator", "deployable", "program", fake_deployable["uuid"], BITSTREAM_ID,
             cloud=True)
    assert ("GET", f"/image/v2/images/{BITSTREAM_ID}") in cloud.requests
    resp = http.get(f"{acceld_all.url}/deployables/{fake_deployable['uuid']}")
    assert resp.json()["bitstream_id"] == BITSTREAM_ID


# ---- attributes ------------------------------------------------------------------------------

def test_attribute_commands(cli) -> None:
    existing = cli.json("accelerator", "device", "attribute", "list")
    rc = [a for a in existing if a["key"] == "rc"]
    assert rc, f"the fake deployable has no rc attribute: {existing}"
    deployable_id = str(rc[0]["deployable_id"])
    key = unique("cli_key")
    created = cli.json("accelerator", "device", "attribute", "create", deployable_id, key, "v1")
    assert (created["key"], created["value"]) == (key, "v1")
    shown = cli.json("accelerator", "device", "attribute", "show", created["uuid"])
    assert (shown["key"], shown["value"]) == (key, "v1")
    assert key in {a["key"] for a in cli.json("accelerator", "device", "attribute", "list")}
    cli.run("accelerator", "device", "attribute", "delete", created["uuid"])
    gone = cli.run("accelerator", "device", "attribute", "show", created["uuid"], check=False)
    assert gone.returncode != 0
