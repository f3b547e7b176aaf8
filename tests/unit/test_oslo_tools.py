"""The oslo tools, run as an operator runs them (the console scripts in .venv/bin), against
acceld's entry points; and the checked-in samples they make, kept in sync with the code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from acceld.api.policy import RULES
from acceld.cmd import samples as sample

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ETC = REPO / "etc" / "acceld"
REGENERATE = "out of date: run `make samples` (the oslo generators over etc/acceld/*.conf)"


def tool(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd or REPO, env={**os.environ, "HOME": "/nonexistent"})


def _section(text: str, group: str) -> str:
    start = text.index(f"\n[{group}]\n")
    end = text.find("\n[", start + 1)
    return text[start:end if end != -1 else None]


def test_config_generator_namespace_acceld_is_complete() -> None:
    done = tool("oslo-config-generator", "--namespace", "acceld")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for group in ("placement", "nova", "glance"):
        section = _section(text, group)
        for option in ("auth_type", "auth_url", "username", "password", "project_name",
                       "user_domain_name", "endpoint_override", "region_name",
                       "connect_retries", "status_code_retries", "cafile", "timeout"):
            assert f"\n#{option} =" in section, (group, option)
    for group in ("DEFAULT", "api", "database", "conductor", "agent", "internal",
                  "privsep_sysfs", "privsep_tools", "privsep_nvml"):
        assert f"[{group}]" in text, group
    assert "\n#privileged_calls = privsep\n" in _section(text, "agent")


def test_checked_in_config_sample_matches_the_code(tmp_path: Path) -> None:
    out = tmp_path / "acceld.conf.sample"
    done = tool("oslo-config-generator", "--config-file",
                str(ETC / "acceld-config-generator.conf"), "--output-file", str(out))
    assert done.returncode == 0, done.stderr
    generated = out.read_text()
    assert generated == (ETC / "acceld.conf.sample").read_text(), REGENERATE
    assert generated == sample.config_sample()  # `acceld config sample` says the same
    for group in ("keystone_authtoken", "oslo_policy", "oslo_limit", "healthcheck", "cors",
                  "oslo_middleware"):
        assert f"\n[{group}]\n" in generated, group
    # acceld's own library defaults (oslo.config.opts.defaults): CORS headers of the API.
    assert "OpenStack-API-Version" in _section(generated, "cors")


def test_generator_conf_lists_the_same_namespaces_as_acceld_config_sample() -> None:
    lines = (ETC / "acceld-config-generator.conf").read_text().splitlines()
    listed = tuple(line.split("=", 1)[1].strip() for line in lines
                   if line.startswith("namespace"))
    assert listed == sample.NAMESPACES


def test_policy_sample_generator_and_checked_in_sample(tmp_path: Path) -> None:
    out = tmp_path / "policy.yaml.sample"
    done = tool("oslopolicy-sample-generator", "--namespace", "acceld",
                "--output-file", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text == (ETC / "policy.yaml.sample").read_text(), REGENERATE
    assert text == sample.policy_sample()
    uncommented = yaml.safe_load("\n".join(line[1:] for line in text.splitlines()
                                           if line.startswith('#"')))
    assert uncommented == {rule.name: rule.check_str for rule in RULES}


def _access(tmp_path: Path, *roles: str) -> Path:
    path = tmp_path / "access.json"
    path.write_text(json.dumps({"token": {
        "roles": [{"name": r} for r in roles],
        "project": {"id": "p1", "name": "p1", "domain": {"id": "default"}},
        "user": {"id": "u1", "domain": {"id": "default"}}}}))
    return path


def test_policy_generator_and_checker_evaluate_acceld_rules(tmp_path: Path) -> None:
    """oslopolicy-policy-generator (through the oslo.policy.enforcer entry point) writes
    the effective policy, an operator override included; oslopolicy-checker evaluates it."""
    override = tmp_path / "policy.yaml"
    override.write_text('"cyborg:device:get_all": "role:reader"\n')
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[oslo_policy]\npolicy_file = {override}\n")
    effective = tmp_path / "effective.yaml"
    done = tool("oslopolicy-policy-generator", "--namespace", "acceld", "--config-file",
                str(conf), "--output-file", str(effective))
    assert done.returncode == 0, done.stderr
    rules = yaml.safe_load(effective.read_text())
    assert rules["cyborg:device:get_all"] == "role:reader"
    assert rules["cyborg:arq:create"] == "rule:project_member_or_service"

    access = _access(tmp_path, "reader")
    checks = {}
    for rule in ("cyborg:arq:get_all", "cyborg:arq:create", "cyborg:device:get_all",
                 "cyborg:device_profile:create"):
        done = tool("oslopolicy-checker", "--policy", str(effective), "--access",
                    str(access), "--rule", rule)
        assert done.returncode == 0, done.stderr
        checks[rule] = done.stdout.strip()
    assert checks == {"cyborg:arq:get_all": "passed: cyborg:arq:get_all",
                      "cyborg:arq:create": "failed: cyborg:arq:create",
                      "cyborg:device:get_all": "passed: cyborg:device:get_all",
                      "cyborg:device_profile:create": "failed: cyborg:device_profile:create"}


def test_policy_upgrade_reads_acceld_defaults(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text('"cyborg:arq:get_all": "rule:admin_or_owner"\n')
    done = tool("oslopolicy-policy-upgrade", "--namespace", "acceld", "--policy", str(old))
    assert done.returncode == 0, done.stderr
    # acceld renamed no rule: the file comes back as it was.
    assert yaml.safe_load(done.stdout) == {"cyborg:arq:get_all": "rule:admin_or_owner"}
