"""Every INI snippet in README.md and docs/ is read by oslo.config as it is written: an
operator pastes them. Each ```ini block is checked against the options of the service it
configures (acceld by default; ```ini nova.conf against Nova's own options, in Nova's
interpreter; ```ini third-party is a driver's own group, checked for syntax only), so an
unknown option, a value its type refuses or a '# comment' after a value fails here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import ini_check

REPO = Path(__file__).resolve().parents[2]
NOVA_PYTHON = REPO / ".nova" / "venv" / "bin" / "python"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
SECTION = re.compile(r"^\[[\w.-]+\]\s*$", re.M)


def _acceld_namespaces() -> list[str]:
    """The namespaces acceld.conf draws on: those of its sample's generator file."""
    return [line.split("=", 1)[1].strip() for line in
            (REPO / "etc/acceld/acceld-config-generator.conf").read_text().splitlines()
            if line.startswith("namespace")]


def _snippets() -> list[tuple[str, str, str]]:
    """(where, info string, text) of every fenced block of the docs."""
    out = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{doc.relative_to(REPO)}:{line}", match.group(1).strip(),
                        match.group(2)))
    return out


SNIPPETS = _snippets()
INI = [(where, info, text) for where, info, text in SNIPPETS if info.split()[:1] == ["ini"]]


def test_the_docs_have_ini_snippets_to_check() -> None:
    assert len(INI) >= 10, INI  # the extraction itself still finds them


@pytest.mark.parametrize("where,info,text", [s for s in SNIPPETS if s not in INI],
                         ids=lambda v: v if isinstance(v, str) and ":" in v else "")
def test_a_config_snippet_is_marked_ini(where: str, info: str, text: str) -> None:
    """A block that looks like a config file is tagged ```ini, so the checks below see it."""
    body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    looks_like_ini = bool(body) and SECTION.match(body[0]) is not None and info in ("", "text")
    assert not looks_like_ini, f"{where}: a config snippet; tag it ```ini"


@pytest.mark.parametrize("where,info,text", INI, ids=[where for where, _i, _t in INI])
def test_ini_snippet_means_what_it_says(where: str, info: str, text: str,
                                        tmp_path: Path) -> None:
    path = tmp_path / "snippet.conf"
    path.write_text(text)
    target = info.split()[1] if len(info.split()) > 1 else "acceld.conf"
    if target == "acceld.conf":
        found = ini_check.problems(str(path), _acceld_namespaces())
    elif target == "nova.conf":
        if not NOVA_PYTHON.exists():
            pytest.skip("Nova is not installed in .nova/venv: `make nova` installs it")
        done = subprocess.run([str(NOVA_PYTHON), "-I", str(Path(ini_check.__file__)),
                               str(path), "nova.conf"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
    elif target == "third-party":
        found = ini_check.syntax_problems(str(path))
    else:
        pytest.fail(f"{where}: ```ini {target}: say acceld.conf, nova.conf or third-party")
    assert not found, f"{where}:\n" + "\n".join(found)


@pytest.mark.parametrize("text,expected", [
    ("[metrics]\napi_enabled = true   # on :9466\n", "no inline comments"),
    ("[database]\nconnection = sqlite://  # a new database\n", "no inline comments"),
    ("[metrics]\napi_enabled = maybe\n", "api_enabled"),
    ("[api]\nno_such_option = 1\n", "no such option"),
    ("[no_such_group]\nx = 1\n", "no such section"),
    ("[placement]\nauth_type = password\nusername = acceld\npasword = x\n", "no such option"),
])
def test_the_check_refuses_what_an_operator_would_trip_on(text: str, expected: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text(text)
    found = ini_check.problems(str(path), _acceld_namespaces())
    assert any(expected in problem for problem in found), found


def test_the_check_accepts_keystoneauth_plugin_options(tmp_path: Path) -> None:
    path = tmp_path / "good.conf"
    path.write_text("[placement]\nauth_type = admin_token\nendpoint = http://127.0.0.1:8778\n"
                    "token = admin\n[nova]\nauth_type = password\nusername = acceld\n"
                    "password = secret # not a comment, part of the password\n")
    found = ini_check.problems(str(path), _acceld_namespaces())
    assert found == ["[nova] password = 'secret # not a comment, part of the password': "
                     "oslo.config has no inline comments, the text after '#' would be part "
                     "of the value"]
