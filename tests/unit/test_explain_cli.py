"""`acceld explain PROFILE [--host H] [--json]`: the explain document as text, against the
database of the config (Placement not configured here: acceld's view alone). Exit status
0 satisfiable, 1 not satisfiable, 2 unknown profile or bad host name."""

import json
import os
import subprocess
import sys

from sqlalchemy import insert, update

from acceld.db.engine import Database
from acceld.db.models import device_profiles, devices, utcnow
from tests.support.inventory import add_fpga


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


def test_explain_prints_the_verdict_then_the_reasons(tmp_path):
    state = str(tmp_path / "state")
    assert run_cli("db", "upgrade", "--state-path", state).returncode == 0
    db = Database(f"sqlite:///{state}/acceld.sqlite")
    groups = json.dumps([{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}])
    with db.write() as conn:
        conn.execute(insert(device_profiles).values(
            uuid="5b0b4fbb-8f5e-4d7e-9d57-3c0e6f9f3b10", name="fpga-dp", profile_json=groups,
            created_at=utcnow()))
    add_fpga(db, hostname="cn-1")
    broken = add_fpga(db, hostname="cn-2")
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == broken["device"]["id"]).values(
            status="maintaining", status_reason="fan swap"))
    db.dispose()

    ok = run_cli("explain", "fpga-dp", "--state-path", state)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "satisfiable on 1 host: cn-1"
    assert "Placement: not configured: Placement is not configured" in ok.stdout
    assert "Group 0: FPGA:1, requires CUSTOM_FAKE_DEVICE" in lines
    assert "  cn-1  cn-1_FakeDevice  usable (1/1 handles free)" in lines

    one = run_cli("explain", "5b0b4fbb-8f5e-4d7e-9d57-3c0e6f9f3b10", "--host", "cn-2",
                  "--state-path", state)
    assert one.returncode == 1, one.stderr
    assert one.stdout.startswith("not satisfiable on host cn-2: group 0 (FPGA:1, requires "
                                 "CUSTOM_FAKE_DEVICE): 1 matching provider, none usable "
                                 "(1 disabled)\n")
    assert (f"      - disabled: device {broken['device']['uuid']} is disabled by an operator: "
            "fan swap") in one.stdout.splitlines()

    doc = run_cli("explain", "fpga-dp", "--json", "--state-path", state)
    assert doc.returncode == 0
    assert json.loads(doc.stdout)["verdict"] == "satisfiable on 1 host: cn-1"

    limited = tmp_path / "acceld.conf"
    limited.write_text("[quota]\narqs_per_project = 0\n")
    over = run_cli("explain", "fpga-dp", "--project", "demo", "--config-file", str(limited),
                   "--state-path", state)
    assert over.returncode == 1
    assert over.stdout.startswith("not satisfiable for project demo: Quota exceeded for "
                                  "accelerator_requests: project demo may hold 0")
    free = run_cli("explain", "fpga-dp", "--project", "demo", "--state-path", state)
    assert free.returncode == 0
    assert "Project demo: may create the profile's 1 ARQ(s)" in free.stdout

    unknown = run_cli("explain", "no-such-dp", "--state-path", state)
    assert unknown.returncode == 2
    assert "Device profile no-such-dp could not be found." in unknown.stderr
    bad = run_cli("explain", "fpga-dp", "--host", "not a host", "--state-path", state)
    assert bad.returncode == 2 and "invalid host name" in bad.stderr
