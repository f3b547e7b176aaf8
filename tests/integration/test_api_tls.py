"""`acceld api` serving HTTPS itself ([api] tls_cert_file / tls_key_file)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.keystone import free_port
from tests.support.tls import self_signed

pytestmark = pytest.mark.integration


def test_public_api_over_tls(tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nstate_path = {tmp_path}\n"
                    f"[api]\nport = {port}\ntls_cert_file = {cert}\ntls_key_file = {key}\n")
    acceld = Path(sys.executable).with_name("acceld")
    subprocess.run([str(acceld), "db", "upgrade", "--config-file", str(conf)], check=True,
                   capture_output=True)
    with open(tmp_path / "api.log", "wb") as log:
        proc = subprocess.Popen([str(acceld), "api", "--config-file", str(conf)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"https://127.0.0.1:{port}/accelerator/v2"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "api.log").read_text()[-2000:]
            # Listening (the master) comes before answering (the workers loading the app).
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                resp = requests.get(url, verify=str(cert), timeout=2)
                break
            assert time.monotonic() < deadline, "acceld api did not start"
            time.sleep(0.1)
        assert resp.status_code == 200
        listed = requests.get(url + "/device_profiles", verify=str(cert), timeout=5)
        assert listed.status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url, timeout=5)  # the system CAs do not know this certificate
        with pytest.raises(requests.RequestException):
            plain = requests.get(url.replace("https", "http"), timeout=5)
            plain.raise_for_status()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
