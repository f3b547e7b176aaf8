"""The privsep helper through the real sudo, with the shipped rules (etc/sudoers.d/
acceld-privsep) installed for a throwaway unprivileged user (issue 37 item 1).

What the user may run as root must not let it choose what root loads: an extra
``--log-config-append`` or ``--config-file`` appended to an allowed command line once ran
code as root (oslo.log's fileConfig evaluates a handler's ``args``). Each attack below runs
as that user through sudo, for each context, and must leave no trace of root running its
code; the legitimate start (the privsep client as the agent runs it, as that user) must
still start each daemon and get an answer.

The rules are installed as shipped, with three things rewritten for this machine: the
user (``acceld``), the install prefix (``/opt/acceld/bin/``: launchers of this tree's
console scripts, as pip writes them) and the config file (``/etc/acceld/acceld.conf``: one
root owns, naming a fixture sysfs tree). Needs root (useradd, /etc/sudoers.d) and sudo
(``make test`` installs it where it can); skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from acceld import privileged
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "sudoers.d" / "acceld-privsep"
SHIPPED_BIN = "/opt/acceld/bin/"
SHIPPED_CONF = "/etc/acceld/acceld.conf"
GPU = "0000:06:00.0"
MDEV = "2d7c3c0a-0000-4000-8000-000000000001"
CONTEXTS = sorted(c.pypath for c in privileged.CONTEXTS)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it adds a user and installs sudoers rules"
    for tool in ("sudo", "visudo", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test-tools installs sudo where it can)"
    return None


@dataclass(frozen=True)
class Rule:
    """One shipped rule, rewritten for this machine: the command and its fixed arguments
    (before ``--privsep_context``), and the context it allows."""

    command: str
    prefix: tuple[str, ...]
    context: str


@dataclass(frozen=True)
class Setup:
    user: str
    uid: int
    gid: int
    base: Path
    conf: Path
    tree: SysfsTree
    rules: tuple[Rule, ...]

    def rule(self, context: str) -> Rule:
        return next(r for r in self.rules if r.context == context)


def rewrite(shipped: str, user: str, bindir: Path, conf: Path) -> str:
    """The shipped rules for ``user``, with the install prefix and config file moved."""
    text = shipped.replace(SHIPPED_BIN, f"{bindir}/").replace(SHIPPED_CONF, str(conf))
    return re.sub(r"(?m)^(Defaults:)?acceld(?=\s)", lambda m: (m.group(1) or "") + user, text)


def parse_rules(text: str) -> tuple[Rule, ...]:
    """The user rules' commands."""
    rules = []
    for line in text.splitlines():
        if "NOPASSWD:" not in line or line.lstrip().startswith("#"):
            continue
        command, _, args = line.split("NOPASSWD:", 1)[1].strip().partition(" ")
        words = args.split()
        at = words.index("--privsep_context")
        rules.append(Rule(command, tuple(words[:at]), words[at + 1]))
    return tuple(rules)


def _entry_point(name: str) -> str:
    """``module:function`` of console script ``name``: this tree's pyproject, else an
    installed distribution's (oslo.privsep's ``privsep-helper``)."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    if name in scripts:
        return scripts[name]
    found = importlib.metadata.entry_points(group="console_scripts", name=name)
    return next(iter(found)).value


def write_launcher(path: Path) -> None:
    """A console script as pip writes it into the virtualenv's bin/ (this interpreter),
    importing this tree first (the venv's editable install may name another)."""
    module, func = _entry_point(path.name).split(":")
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                    f"from {module} import {func}\nsys.exit({func}())\n")
    path.chmod(0o755)


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture(scope="module")
def user() -> Iterator[tuple[str, int, int]]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    name = f"acceldt{secrets.token_hex(4)}"
    for _ in range(10):  # another useradd (a test worker beside this one) may hold the lock
        done = _run(["useradd", "--system", "--no-create-home", "--user-group",
                     "--shell", "/usr/sbin/nologin", name])
        if done.returncode == 0 or "lock" not in done.stderr:
            break
        time.sleep(0.5)
    assert done.returncode == 0, done.stderr
    try:
        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        _run(["userdel", name])


def _install_sudoers(text: str) -> Callable[[], None]:
    """``text`` as /etc/sudoers.d/<unique name> (no dot: sudo skips such names), checked
    by visudo alone first and then with everything else; returns its removal."""
    with tempfile.NamedTemporaryFile("w", prefix="acceld-sudoers-", delete=False) as f:
        f.write(text)
    try:
        checked = _run(["visudo", "-cf", f.name])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        os.unlink(f.name)
    path = Path("/etc/sudoers.d") / f"acceld-test-{secrets.token_hex(6)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o440)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    checked = _run(["visudo", "-c"])
    if checked.returncode != 0:
        path.unlink()
        pytest.fail(checked.stdout + checked.stderr)
    if str(path) not in checked.stdout:
        path.unlink()
        pytest.skip("/etc/sudoers does not include /etc/sudoers.d (@includedir)")
    return path.unlink


def _setup(user: tuple[str, int, int], loosen: bool = False) -> Iterator[Setup]:
    """The shipped rules installed for ``user`` (``loosen``: each with ``*`` for all its
    arguments), their commands' launchers, and a root-owned config and fixture tree."""
    name, uid, gid = user
    base = Path(tempfile.mkdtemp(prefix="acceld-sudo-"))
    try:
        base.chmod(0o755)
        bindir = base / "bin"
        bindir.mkdir(mode=0o755)
        (base / "images").mkdir(mode=0o755)
        tree = SysfsTree(base / "sys")
        tree.add_pci(GPU, "0x10de", "0x1eb8", "0x030200")
        tree.add_mdev_type(GPU, "nvidia-1", "GRID T4-1B", 16)
        tree.add_mdev(GPU, "nvidia-1", MDEV)
        make_tool(base / "fpgaconf")
        conf = base / "acceld.conf"
        conf.write_text(f"[nvidia_gpu]\nsysfs_root = {tree.root}\n"
                        f"[intel_fpga]\nfpgaconf_path = {base / 'fpgaconf'}\n"
                        f"[agent]\nbitstream_dir = {base / 'images'}\n")
        conf.chmod(0o644)
        text = rewrite(SHIPPED.read_text(), name, bindir, conf)
        rules = parse_rules(text)
        for command in {r.command for r in rules}:
            write_launcher(Path(command))
        if loosen:
            text = re.sub(r"(?m)^(\S+ ALL = \(root\) NOPASSWD: \S+) .*$", r"\1 *", text)
        remove = _install_sudoers(text)
        try:
            yield Setup(name, uid, gid, base, conf, tree, rules)
        finally:
            remove()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shipped(user) -> Iterator[Setup]:
    """The shipped rules, installed."""
    yield from _setup(user)


def _user_dir(setup: Setup, name: str) -> Path:
    """A directory the unprivileged user owns (its own files: the attacker's)."""
    path = Path(tempfile.mkdtemp(prefix=f"acceld-{name}-"))
    os.chown(path, setup.uid, setup.gid)
    return path


def _as_user(setup: Setup, argv: list[str]) -> subprocess.CompletedProcess:
    return _run(argv, user=setup.uid, group=setup.gid, extra_groups=[], cwd="/",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def _evil_files(setup: Setup, where: Path) -> tuple[Path, Path, Path]:
    """The attacker's logging config (its handler's ``args`` write the euid to a marker)
    and a config file naming it; both the user's own."""
    marker = where / "ran-as"
    ini = where / "evil.ini"
    ini.write_text("[loggers]\nkeys=root\n[handlers]\nkeys=h\n[formatters]\nkeys=\n"
                   "[logger_root]\nhandlers=h\n[handler_h]\nclass=StreamHandler\n"
                   f"args=(open({str(marker)!r}, 'w').write(str(__import__('os').geteuid()))"
                   " and None,)\n")
    conf = where / "evil.conf"
    conf.write_text(f"[DEFAULT]\nlog_config_append = {ini}\n")
    for path in (ini, conf):
        os.chown(path, setup.uid, setup.gid)
    return marker, ini, conf


def _attack(setup: Setup, context: str, kind: str) -> tuple[Path, subprocess.CompletedProcess]:
    rule = setup.rule(context)
    where = _user_dir(setup, "attack")
    marker, ini, conf = _evil_files(setup, where)
    extra = {"log-config-append": ["--log-config-append", str(ini)],
             "config-file": ["--config-file", str(conf)]}[kind]
    sock = "/tmp/tmpabcd_123/privsep.sock"  # the form the privsep client makes
    argv = ["sudo", "-n", rule.command, *rule.prefix, "--privsep_context", context,
            "--privsep_sock_path", sock, *extra]
    return marker, _as_user(setup, argv)


@pytest.mark.parametrize("kind", ["log-config-append", "config-file"])
@pytest.mark.parametrize("context", CONTEXTS)
def test_an_appended_option_runs_nothing_as_root(shipped: Setup, context: str,
                                                  kind: str) -> None:
    marker, done = _attack(shipped, context, kind)
    try:
        assert not marker.exists(), (
            f"code ran as euid {marker.read_text()} through sudo: {done.stderr}")
        assert done.returncode != 0
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def loose(user) -> Iterator[Setup]:
    """The shipped rules with every argument replaced by a ``*``: whatever sudo lets
    through, the helper itself must refuse all but the one shape."""
    yield from _setup(user, loosen=True)


@pytest.mark.parametrize("kind", ["log-config-append", "config-file"])
@pytest.mark.parametrize("context", CONTEXTS)
def test_the_helper_refuses_appended_options_even_where_sudo_admits_them(
        loose: Setup, context: str, kind: str) -> None:
    marker, done = _attack(loose, context, kind)
    try:
        assert not marker.exists(), f"code ran as euid {marker.read_text()}: {done.stderr}"
        assert done.returncode == 2, done.stderr
        assert "acceld-privsep-helper: refused: expected --config-file PATH" in done.stderr
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)


SOCK = "/tmp/tmpabcd_123/privsep.sock"
VARIATIONS = {
    # name: (argv after the command, with {conf} {evil_conf} {ini} {dir}; what it says)
    "joined --config-file=": (["--config-file={evil_conf}", "--privsep_context",
                               "acceld.privileged.sysfs", "--privsep_sock_path", SOCK],
                              "expected --config-file PATH"),
    "the caller's config file": (["--config-file", "{evil_conf}", "--privsep_context",
                                  "acceld.privileged.sysfs", "--privsep_sock_path", SOCK],
                                 "is owned by uid"),
    "root's and the caller's": (["--config-file", "{conf}", "--config-file", "{evil_conf}",
                                 "--privsep_context", "acceld.privileged.sysfs",
                                 "--privsep_sock_path", SOCK], "is owned by uid"),
    "a config dir": (["--config-file", "{conf}", "--config-dir", "{dir}",
                      "--privsep_context", "acceld.privileged.sysfs",
                      "--privsep_sock_path", SOCK], "expected --config-file PATH"),
    "options first": (["--log-config-append", "{ini}", "--config-file", "{conf}",
                       "--privsep_context", "acceld.privileged.sysfs",
                       "--privsep_sock_path", SOCK], "expected --config-file PATH"),
    "an abbreviation appended": (["--config-file", "{conf}", "--privsep_context",
                                  "acceld.privileged.sysfs", "--privsep_sock_path", SOCK,
                                  "--log-config", "{ini}"], "expected --config-file PATH"),
    "the context twice": (["--config-file", "{conf}", "--privsep_context",
                           "acceld.privileged.sysfs", "--privsep_context",
                           "acceld.privileged.tools", "--privsep_sock_path", SOCK],
                          "expected --config-file PATH"),
    "-- then more": (["--config-file", "{conf}", "--privsep_context",
                      "acceld.privileged.sysfs", "--privsep_sock_path", SOCK, "--",
                      "--log-config-append", "{ini}"], "expected --config-file PATH"),
    "one word with spaces": (["--config-file", "{conf}", "--privsep_context",
                              "acceld.privileged.sysfs",
                              "--privsep_sock_path " + SOCK + " --log-config-append {ini}",
                              SOCK], "expected --config-file PATH"),
    "a space in the socket": (["--config-file", "{conf}", "--privsep_context",
                               "acceld.privileged.sysfs", "--privsep_sock_path",
                               "/tmp/tmpabc 0123/privsep.sock"], "spaces"),
    "another context": (["--config-file", "{conf}", "--privsep_context",
                         "oslo_privsep.priv_context.PrivContext", "--privsep_sock_path", SOCK],
                        "--privsep_context must be one of"),
    "the log config as the socket": (["--config-file", "{conf}", "--privsep_context",
                                      "acceld.privileged.sysfs", "--privsep_sock_path",
                                      "{ini}"], "--privsep_sock_path must be"),
}


@pytest.mark.parametrize("variation", sorted(VARIATIONS))
def test_the_helper_refuses_every_other_command_line(loose: Setup, variation: str) -> None:
    where = _user_dir(loose, "variation")
    try:
        marker, ini, evil_conf = _evil_files(loose, where)
        args, says = VARIATIONS[variation]
        argv = [a.format(conf=loose.conf, evil_conf=evil_conf, ini=ini, dir=where)
                for a in args]
        command = loose.rule("acceld.privileged.sysfs").command
        done = _as_user(loose, ["sudo", "-n", command, *argv])
        assert not marker.exists(), f"code ran as euid {marker.read_text()}: {done.stderr}"
        assert done.returncode == 2, done.stderr
        assert "acceld-privsep-helper: refused: " in done.stderr
        assert says in done.stderr
    finally:
        shutil.rmtree(where, ignore_errors=True)


HOSTILE = ('Defaults:{user} !env_reset, setenv\n'
           'Defaults:{user} env_keep += "PYTHONPYCACHEPREFIX PYTHONWARNINGS SUDO_UID '
           'SUDO_GID"\n')


@pytest.fixture
def hostile(shipped: Setup) -> Iterator[None]:
    """Global defaults for the user that keep its environment and let it set variables
    (the rules' own ``Defaults!`` line must still decide for the helper)."""
    remove = _install_sudoers(HOSTILE.format(user=shipped.user))
    yield
    remove()


@pytest.mark.parametrize("claim", ["none", "kept SUDO_UID=0", "given SUDO_UID=0"])
def test_root_connects_only_where_the_caller_could(shipped: Setup, hostile: None,
                                                   claim: str) -> None:
    """A socket path the rule admits (/tmp/tmpXXXXXXXX/privsep.sock) naming root's own
    listener (another root service's privsep client): the helper must not connect, even
    when the caller claims to be root in the variables sudo sets."""
    import socket

    directory = Path(tempfile.mkdtemp())  # root's, 0700: as a root privsep client makes it
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(directory / "privsep.sock"))
        listener.listen(1)
        listener.setblocking(False)
        rule = shipped.rule("acceld.privileged.sysfs")
        argv = [rule.command, *rule.prefix, "--privsep_context", rule.context,
                "--privsep_sock_path", str(directory / "privsep.sock")]
        env = {"PATH": "/usr/bin:/bin"}
        if claim == "kept SUDO_UID=0":
            env.update(SUDO_UID="0", SUDO_GID="0")
        if claim == "given SUDO_UID=0":
            argv = ["SUDO_UID=0", "SUDO_GID=0", *argv]
        done = _run(["sudo", "-n", *argv], user=shipped.uid, group=shipped.gid,
                    extra_groups=[], cwd="/", env=env)
        if claim == "given SUDO_UID=0":
            assert done.returncode == 1
            assert "not allowed to set the following environment variables" in done.stderr
            return
        assert done.returncode == 1
        assert f"cannot connect to {directory}/privsep.sock: Permission denied" \
            in done.stderr, done.stderr
        with pytest.raises(BlockingIOError):  # the helper has exited: any connect is queued
            listener.accept()[0].close()
    finally:
        listener.close()
        shutil.rmtree(directory)


def test_no_environment_reaches_root_whatever_the_defaults(shipped: Setup,
                                                           hostile: None) -> None:
    """Under hostile global defaults the rules' own ``Defaults!`` line still resets the
    environment for the helper, so a ``PYTHONPYCACHEPREFIX`` of the caller's (where root's
    interpreter would read and write its bytecode) never reaches root: nothing is written
    there."""
    where = _user_dir(shipped, "env")
    try:
        rule = shipped.rule("acceld.privileged.sysfs")
        args = [rule.command, *rule.prefix, "--privsep_context", rule.context,
                "--privsep_sock_path", SOCK]
        kept = _run(["sudo", "-n", *args], user=shipped.uid, group=shipped.gid,
                    extra_groups=[], cwd="/",
                    env={"PATH": "/usr/bin:/bin", "PYTHONPYCACHEPREFIX": str(where)})
        given = _as_user(shipped, ["sudo", "-n", f"PYTHONPYCACHEPREFIX={where}", *args])
        assert f"cannot connect to {SOCK}: No such file" in kept.stderr, kept.stderr
        assert given.returncode != 0
        assert list(where.iterdir()) == []
    finally:
        shutil.rmtree(where, ignore_errors=True)


# --- the legitimate start, as the agent does it ----------------------------------------

def _client_calls(setup: Setup) -> dict[str, str]:
    """In this process, as the unprivileged user: each context's daemon started by the
    privsep client through sudo (its helper_command as README.md shows it), one call each.
    What each call returned or raised, by context."""
    from oslo_config import cfg

    out: dict[str, str] = {}
    for context in privileged.CONTEXTS:
        rule = setup.rule(context.pypath)
        cfg.CONF.set_override("helper_command", " ".join(["sudo", "-n", rule.command,
                                                          *rule.prefix]),
                              group=context.cfg_section)
        context.set_client_mode(True)
    remove = setup.tree.root / "bus" / "mdev" / "devices" / MDEV / "remove"
    privileged.write_sysfs(str(remove), "1")
    out["acceld.privileged.sysfs"] = remove.read_text()
    image = setup.base / "images" / "x.gbs"
    status, _, _ = privileged.run_tool(
        [str(setup.base / "fpgaconf"), "--bus", "0x3b", "--device", "0x00", "--function",
         "0x0", str(image)], 30)
    out["acceld.privileged.tools"] = f"exit {status}"
    try:
        out["acceld.privileged.nvml"] = repr(privileged.read_gpu_instances(GPU))
    except RuntimeError as exc:  # no NVIDIA driver here: NVML's own refusal, by name
        out["acceld.privileged.nvml"] = str(exc)
    return out


def _run_as_user(setup: Setup, func: Callable[[Setup], dict[str, str]]) -> dict[str, str]:
    """``func(setup)`` in a child of this process that has given up root for good
    (setresuid to the user, no supplementary groups): the interpreter here lives under
    /root, which the user cannot reach, so the child keeps the modules already loaded."""
    import oslo_privsep.comm  # noqa: F401 (the client's modules, loaded while we can)
    import oslo_privsep.daemon  # noqa: F401

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(setup.gid, setup.gid, setup.gid)
            os.setresuid(setup.uid, setup.uid, setup.uid)
            os.environ.update(HOME="/", TMPDIR="/tmp")
            try:
                result = {"ok": func(setup)}
            except BaseException as exc:  # noqa: BLE001 (reported to the parent)
                result = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(result).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    deadline = time.monotonic() + 120
    chunks = []
    try:
        while time.monotonic() < deadline:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the unprivileged client did not finish in 120 s")
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    finally:
        os.close(read)
    result = json.loads(b"".join(chunks) or b'{"error": "no result"}')
    assert "ok" in result, result["error"]
    return result["ok"]


def test_the_agent_starts_each_daemon_through_sudo(shipped: Setup) -> None:
    (shipped.base / "images" / "x.gbs").write_bytes(b"GBS")
    answers = _run_as_user(shipped, _client_calls)
    assert answers["acceld.privileged.sysfs"] == "1"
    assert answers["acceld.privileged.tools"] == "exit 0"
    assert calls(shipped.base / "fpgaconf") == [
        ["--bus", "0x3b", "--device", "0x00", "--function", "0x0",
         str(shipped.base / "images" / "x.gbs")]]
    assert answers["acceld.privileged.nvml"].startswith("NVML: "), answers
