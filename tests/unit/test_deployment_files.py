"""The deployment files in etc/: systemd units verified by systemd-analyze where it exists
(else parsed and checked here), each running a real acceld command; the sudoers rule
matching the privsep contexts."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from acceld import privileged
from acceld.cmd import main as cli
from acceld.cmd import privsep_helper
from acceld.conf import privsep as conf_privsep

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "etc" / "systemd"
INSTALLED_BIN = "/opt/acceld/bin/"
SERVICES = {"acceld-api.service": "api", "acceld-conductor.service": "conductor",
            "acceld-agent.service": "agent", "acceld-driver@.service": "driver"}


def _parse(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: sections, Key=Value lines, # comments, keys may repeat."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"line {number}: {line!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture
def local_units(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this checkout's venv (what the recipe installs
    under /opt/acceld), and the template instantiated for the fake driver."""
    out = []
    for name in SERVICES:
        text = (UNITS / name).read_text().replace(INSTALLED_BIN, f"{Path(sys.executable).parent}/")
        target = tmp_path / (name.replace("@.", "@fake.") if "@." in name else name)
        target.write_text(text)
        out.append(target)
    return out


def test_every_unit_is_there() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(SERVICES)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="no systemd-analyze here: test_units_parse checks them instead")
def test_systemd_analyze_verifies_the_units(local_units: list[Path]) -> None:
    done = subprocess.run(["systemd-analyze", "verify", *map(str, local_units)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # Unknown keys and bad values are only warnings to systemd: none may appear.
    assert done.stderr.strip() == "", done.stderr


def test_systemd_analyze_would_catch_a_bad_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze")
    bad = tmp_path / "acceld-bad.service"
    bad.write_text((UNITS / "acceld-api.service").read_text()
                   .replace("ProtectHome=", "ProtectHom=")
                   .replace(INSTALLED_BIN, f"{Path(sys.executable).parent}/"))
    done = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert "Unknown key 'ProtectHom'" in done.stderr


@pytest.mark.parametrize("name, command", SERVICES.items())
def test_units_parse_and_run_acceld_commands(name: str, command: str) -> None:
    unit = _parse((UNITS / name).read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert service["User"] == ["acceld"] and service["Group"] == ["acceld"]
    assert service["Restart"] == ["on-failure"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    (exec_start,) = service["ExecStart"]
    argv = exec_start.split()
    assert argv[0] == INSTALLED_BIN + "acceld"
    assert argv[1] == command
    # The command line is one the acceld CLI accepts (the template's %i is a driver name).
    args = cli.build_parser().parse_args([a.replace("%i", "fake") for a in argv[1:]])
    assert args.config_file == ["/etc/acceld/acceld.conf"]
    if command in ("api", "conductor"):  # nothing privileged: no capability at all
        assert service["CapabilityBoundingSet"] == [""]
        assert service["NoNewPrivileges"] == ["yes"]
    else:  # sudo acceld-privsep-helper must work: no NoNewPrivileges
        assert "NoNewPrivileges" not in service


def test_sudoers_rules_allow_exactly_the_command_lines_of_the_privsep_contexts() -> None:
    """One rule per context, each one exact command line of acceld-privsep-helper (no
    ``*``: sudo matches the arguments as one string), the one README's helper_command
    gives once oslo.privsep appends its two options; and the environment reset for it."""
    text = (REPO / "etc" / "sudoers.d" / "acceld-privsep").read_text()
    lines = [line for line in text.splitlines() if line.startswith("acceld ALL")]
    helper = INSTALLED_BIN + "acceld-privsep-helper"
    assert f"Defaults!{helper} env_reset, !env_keep, !setenv" in text.splitlines()
    readme = (REPO / "README.md").read_text()
    commands = set(re.findall(r"(?m)^helper_command = (.*)$", readme))
    assert len(commands) == 1, commands
    command = commands.pop()
    assert command in conf_privsep.HELPER_COMMAND_HELP  # what the sample config says
    argv = shlex.split(command)
    assert argv[:2] == ["sudo", helper]
    sock = "/tmp/tmpabcd_123/privsep.sock"  # the privsep client's mkdtemp() form
    contexts = []
    for line in lines:
        command, args = line.split("NOPASSWD: ")[1].split(" ", 1)
        assert command == helper and "*" not in args and "?" not in args
        context = args.split("--privsep_context ")[1].split()[0]
        contexts.append(context)
        built = argv[2:] + ["--privsep_context", context, "--privsep_sock_path", sock]
        assert fnmatch.fnmatchcase(" ".join(built), args)
        assert privsep_helper.parse_argv(built).context == context
        for extra in (" --log-config-append x", " x", "x"):
            assert not fnmatch.fnmatchcase(" ".join(built) + extra, args)
    assert sorted(contexts) == sorted(c.pypath for c in privileged.CONTEXTS)
