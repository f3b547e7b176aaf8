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


def test_a_stalled_tls_handshake_is_dropped_and_blocks_no_one(tmp_path) -> None:
    """With TLS served by acceld, the handshake is under the header deadline too."""
    import socket

    cert, key = self_signed(tmp_path)
    port = free_port()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nstate_path = {tmp_path}\n"
                    f"[api]\nport = {port}\ntls_cert_file = {cert}\ntls_key_file = {key}\n"
                    "workers = 1\nthreads = 2\nclient_header_timeout = 2\n")
    acceld = Path(sys.executable).with_name("acceld")
    subprocess.run([str(acceld), "db", "upgrade", "--config-file", str(conf)], check=True,
                   capture_output=True)
    with open(tmp_path / "api.log", "wb") as log:
        proc = subprocess.Popen([str(acceld), "api", "--config-file", str(conf)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"https://127.0.0.1:{port}/accelerator/v2"
    stalled: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "api.log").read_text()[-2000:]
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(url, verify=str(cert), timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "acceld api did not start"
            time.sleep(0.1)
        # Both threads of the only worker get a handshake that never completes: the
        # first bytes of a TLS record, then nothing.
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"\x16\x03\x01\x02\x00\x01")
            stalled.append(sock)
        opened = time.monotonic()
        for sock in stalled:
            sock.settimeout(6)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(4096) == b""  # closed, no answer
        assert 1.5 <= time.monotonic() - opened <= 4.5
        started = time.monotonic()
        assert requests.get(url, verify=str(cert), timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
        assert "its request headers did not arrive within 2 s" in \
            (tmp_path / "api.log").read_text()
    finally:
        for sock in stalled:
            sock.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
