"""README's replacement of upstream Cyborg on the shipped systemd units (issue 40).

The units run ``User=acceld`` with ``ProtectSystem=strict`` and only ``--config-file
/etc/acceld/acceld.conf``. README passes upstream's cyborg.conf with a drop-in, gives the
acceld user a copy it can read, and sets ``[DEFAULT] log_dir`` and ``state_path`` in the
replacement acceld.conf (cyborg.conf's would be inherited: unwritable, and read-only
under ProtectSystem=strict). Here: the drop-in, merged with the unit, runs the two files
in that order (and systemd-analyze accepts it); the replacement acceld.conf puts logs and
state in the unit's LogsDirectory and StateDirectory; and the conductor, run as an
unprivileged user from upstream's cyborg.conf (mode 0640, group of that user) and README's
acceld.conf, starts without "Permission denied", where without README's ``[DEFAULT]``
lines it stops on cyborg.conf's log directory.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from oslo_config import cfg

from acceld import config
from acceld.cmd import main as cli
from tests.support.net import free_port
from tests.unit.test_deployment_files import INSTALLED_BIN, UNITS, _parse
from tests.unit.test_upstream_conf import render

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DROP_IN = "# /etc/systemd/system/acceld-conductor.service.d/cyborg.conf"
ACCELD_CONF = "# /etc/acceld/acceld.conf, beside an upstream cyborg.conf"
USER = "nobody"  # a throwaway unprivileged user standing for acceld


def readme_block(first_line: str) -> str:
    """The fenced block of README.md whose first line is ``first_line``."""
    for found in re.finditer(r"```\w*\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        if found.group(1).startswith(first_line + "\n"):
            return found.group(1)
    raise AssertionError(f"README.md has no block starting {first_line!r}")


def exec_start(unit: str, drop_in: str) -> list[str]:
    """The unit's command line once the drop-in is applied (an empty ExecStart= clears)."""
    lines: list[str] = []
    for text in (unit, drop_in):
        for value in _parse(text).get("Service", {}).get("ExecStart", []):
            lines = [] if value == "" else lines + [value]
    assert len(lines) == 1, lines
    return lines[0].split()


def test_the_drop_in_runs_cyborg_conf_then_acceld_conf(tmp_path: Path) -> None:
    unit = (UNITS / "acceld-conductor.service").read_text()
    drop_in = readme_block(DROP_IN)
    argv = exec_start(unit, drop_in)
    assert argv[0] == INSTALLED_BIN + "acceld"
    args = cli.build_parser().parse_args(argv[1:])
    assert args.config_file == ["/etc/acceld/cyborg.conf", "/etc/acceld/acceld.conf"]
    if shutil.which("systemd-analyze") is None:
        return
    local = f"{Path(sys.executable).parent}/"
    (tmp_path / "acceld-conductor.service").write_text(unit.replace(INSTALLED_BIN, local))
    (tmp_path / "acceld-conductor.service.d").mkdir()
    dropped = tmp_path / "acceld-conductor.service.d" / "cyborg.conf"
    dropped.write_text(drop_in.replace(INSTALLED_BIN, local))
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "acceld-conductor.service")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


@pytest.mark.parametrize("fixture", ["kolla-cyborg.conf", "devstack-cyborg.conf"])
def test_the_replacement_conf_puts_logs_and_state_where_the_units_may_write(
        tmp_path, fixture) -> None:
    service = _parse((UNITS / "acceld-conductor.service").read_text())["Service"]
    cyborg = render(fixture, tmp_path, log_dir="/var/log/kolla/cyborg",
                    state_path="/opt/stack/data/cyborg")
    ours = tmp_path / "acceld.conf"
    ours.write_text(readme_block(ACCELD_CONF))
    conf = config.load(config_files=[str(cyborg), str(ours)], conf=cfg.ConfigOpts())
    assert conf.log_dir == "/var/log/" + service["LogsDirectory"][0]
    assert conf.state_path == "/var/lib/" + service["StateDirectory"][0]


# -- the conductor as an unprivileged user --------------------------------------------------

def _python_for(user: str) -> list[str]:
    """A command line running acceld's CLI that ``user`` can execute: this venv's python,
    or (a venv made from a Python under /root) the system's of the same version with the
    venv's packages on the path."""
    probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "pass"],
                           capture_output=True, timeout=30)
    if probe.returncode == 0:
        return [sys.executable, "-m", "acceld.cmd.main"]
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip(f"{user} cannot run {sys.executable} and there is no {system}")
    return ["env", f"PYTHONPATH={sysconfig.get_paths()['purelib']}:{REPO}", str(system),
            "-m", "acceld.cmd.main"]


@pytest.fixture
def machine() -> Iterator[Path]:
    """A directory tree standing for /etc and /var, traversable by the throwaway user."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to run as another user")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER}")
    base = Path(tempfile.mkdtemp(prefix="acceld-units-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _start(command: list[str], port: int, log: Path) -> tuple[bool, str]:
    """Run the conductor until it listens (True) or exits (False); its output."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd="/")
    listening = False
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                listening = True
                break
            except OSError:
                time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
        output, _ = proc.communicate(timeout=60)
    return listening, output + (log.read_text() if log.exists() else "")


def test_the_conductor_starts_as_its_user_from_upstreams_conf(machine: Path) -> None:
    user = pwd.getpwnam(USER)
    group = grp.getgrgid(user.pw_gid)
    etc, var_log_cyborg = machine / "etc", machine / "cyborg-log"
    logs, state = machine / "acceld-log", machine / "acceld-state"
    for path in (etc, var_log_cyborg):  # root's, as upstream left them
        path.mkdir(mode=0o755)
    for path in (logs, state):  # the units' LogsDirectory and StateDirectory
        path.mkdir(mode=0o750)
        os.chown(path, user.pw_uid, user.pw_gid)
    cyborg = render("kolla-cyborg.conf", etc, log_dir=var_log_cyborg, host="compute-01")
    ours = etc / "acceld.conf"
    ours.write_text(readme_block(ACCELD_CONF).replace("/var/log/acceld", str(logs))
                    .replace("/var/lib/acceld", str(state)))
    port = free_port()
    test_only = etc / "test.conf"  # what a real cloud has in place of README's placeholders
    test_only.write_text(f"[database]\nconnection = sqlite:///{state / 'acceld.sqlite'}\n"
                         f"[internal]\nshared_secret = {secrets.token_hex(32)}\n"
                         f"[conductor]\nhost_ip = 127.0.0.1\nport = {port}\n"
                         f"url = http://127.0.0.1:{port}\n")
    for path in (cyborg, ours, test_only):  # README: install -o root -g acceld -m 0640
        os.chown(path, 0, group.gr_gid)
        path.chmod(0o640)
    files = ["--config-file", str(cyborg), "--config-file", str(ours),
             "--config-file", str(test_only)]
    run_as = ["runuser", "-u", USER, "--", *_python_for(USER)]
    upgraded = subprocess.run([*run_as, "db", "upgrade", *files], capture_output=True,
                              text=True, timeout=120, cwd="/")
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr

    listening, output = _start([*run_as, "conductor", *files], port, logs / "acceld-conductor.log")
    assert listening, output[-3000:]
    assert "Permission denied" not in output, output[-3000:]
    assert (logs / "acceld-conductor.log").exists(), sorted(os.listdir(logs))

    # Without README's [DEFAULT] lines, cyborg.conf's log_dir is inherited: it stops.
    ours.write_text(re.sub(r"(?m)^log_dir = .*\n", "", ours.read_text()))
    listening, output = _start([*run_as, "conductor", *files], port, logs / "none")
    assert not listening and "Permission denied" in output, output[-3000:]


def test_readmes_loop_writes_the_drop_in_it_shows() -> None:
    """The shell loop's printf, run for the conductor, writes the drop-in shown after it."""
    text = (REPO / "README.md").read_text()
    (printf,) = re.findall(r"(?m)^\s*(printf '\[Service\].*)\\\n\s*(.*)\|$", text)
    command = " ".join(part.strip() for part in printf)
    done = subprocess.run(["bash", "-c", f"svc=conductor; {command}"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == readme_block(DROP_IN).split("\n", 1)[1]
