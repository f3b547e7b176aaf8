"""`acceld claim PROFILE [--host H]` and `acceld release ARQ` against a real `acceld all`
(fake driver: one FPGA with 16 attach handles, noauth API): the claim is bound by the
all-in-one's conductor and prints the attach handle; release frees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Iterator

import pytest
import requests

from tests.helpers import ADMIN
from tests.support import allinone
from tests.support.net import free_port

pytestmark = pytest.mark.integration

HOST = "claim-cli-node"


@pytest.fixture(scope="module")
def acceld(tmp_path_factory) -> Iterator[allinone.Launched]:
    state = str(tmp_path_factory.mktemp("acceld-claim-cli"))
    config = os.path.join(state, "acceld.conf")
    with open(config, "w") as handle:
        handle.write(f"[DEFAULT]\nhost = {HOST}\n\n[conductor]\nport = {free_port()}\n\n"
                     f"[agent]\nport = {free_port()}\nenabled_drivers = fake\n"
                     "heartbeat_interval = 1\n")
    launched = allinone.launch(state, config)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            resp = requests.get(f"{launched.url}/deployables", headers=ADMIN, timeout=10)
            if resp.status_code == 200 and resp.json()["deployables"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the fake deployable did not appear")
        assert requests.post(f"{launched.url}/device_profiles", headers=ADMIN, timeout=10,
                             json=[{"name": "fpga-1", "groups": [{"resources:FPGA": "1"}]}]
                             ).status_code == 201
        yield launched
    finally:
        allinone.stop(launched.proc)


def run_cli(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args, "--url", url],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "OS_TOKEN"})


def test_claim_prints_the_handle_and_release_frees_it(acceld):
    claimed = run_cli("claim", "fpga-1", "--host", HOST, url=acceld.url)
    assert claimed.returncode == 0, claimed.stderr + claimed.stdout
    [line] = claimed.stdout.splitlines()
    words = line.split()
    arq = words[1]
    # The fake driver's handles are upstream's TEST_PCI addresses.
    assert line.startswith(f"ARQ {arq} Bound on {HOST} (consumer {arq}): TEST_PCI {{")
    info = json.loads(line.split(": TEST_PCI ", 1)[1])
    shown = requests.get(f"{acceld.url}/accelerator_requests/{arq}", headers=ADMIN,
                         timeout=10).json()
    assert shown["state"] == "Bound" and shown["attach_handle_info"] == info

    released = run_cli("release", arq, url=acceld.url)
    assert released.returncode == 0, released.stderr
    assert released.stdout == f"ARQ {arq} released\n"
    assert requests.get(f"{acceld.url}/accelerator_requests/{arq}", headers=ADMIN,
                        timeout=10).status_code == 404
    again = run_cli("release", arq, url=acceld.url)
    assert again.returncode == 2 and "404" in again.stderr


def test_refusals_exit_2_with_the_api_message(acceld):
    unknown = run_cli("claim", "no-such-profile", url=acceld.url)
    assert unknown.returncode == 2
    assert "404 Device profile 'no-such-profile' could not be found." in unknown.stderr
    elsewhere = run_cli("claim", "fpga-1", "--host", "other-host", url=acceld.url)
    assert elsewhere.returncode == 2 and "Host other-host has no accelerator" in elsewhere.stderr
