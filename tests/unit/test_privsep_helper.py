"""acceld-privsep-helper (acceld.cmd.privsep_helper), the command sudo runs as root for
the ``acceld`` user (issue 37 item 1): the one command-line shape it accepts, the config
files it reads, whose credentials connect its socket, and that nothing a root-owned
config names for logging is read or written. The helper through the real sudo:
tests/integration/test_privsep_sudo.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from oslo_config import cfg

from acceld import privileged
from acceld.privileged import policy as privileged_policy
from acceld.cmd import privsep_helper
from acceld.cmd.privsep_helper import Invocation, Refused, parse_argv
from tests.support.sysfs_fixtures import SysfsTree

REPO = Path(__file__).resolve().parents[2]
CONF = "/etc/acceld/acceld.conf"
SOCK = "/tmp/tmpabcd_123/privsep.sock"
SYSFS = "acceld.privileged.sysfs"
OTHER = 4321  # a uid that is not root's
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setuid)")


def good(*files: str, context: str = SYSFS, sock: str = SOCK) -> list[str]:
    out = []
    for path in files or (CONF,):
        out += ["--config-file", path]
    return out + ["--privsep_context", context, "--privsep_sock_path", sock]


@pytest.mark.parametrize("context", sorted(c.pypath for c in privileged.CONTEXTS))
def test_the_command_line_privsep_builds_is_accepted(context: str) -> None:
    assert parse_argv(good(context=context)) == Invocation((CONF,), context, SOCK)
    assert parse_argv(good(CONF, "/etc/acceld/node.conf", context=context)).config_files \
        == (CONF, "/etc/acceld/node.conf")
    deep = "/var/tmp/agent/tmpzz_00099/privsep.sock"  # any TMPDIR, with mkdtemp's name
    assert parse_argv(good(sock=deep)).sock_path == deep


SHAPE = "expected --config-file PATH"
REFUSED = {
    "nothing": ([], SHAPE),
    "no config file": (["--privsep_context", SYSFS, "--privsep_sock_path", SOCK], SHAPE),
    "an appended --log-config-append": (good() + ["--log-config-append", "/tmp/x.ini"],
                                        SHAPE),
    "an appended --config-file": (good() + ["--config-file", "/tmp/x.conf"], SHAPE),
    "an appended abbreviation": (good() + ["--log-config", "/tmp/x.ini"], SHAPE),
    "one word more": (good() + ["--debug"], SHAPE),
    "--opt=value": (["--config-file=" + CONF, "--privsep_context", SYSFS,
                     "--privsep_sock_path", SOCK], SHAPE),
    "a joined context": (["--config-file", CONF, "--privsep_context=" + SYSFS,
                          "--privsep_sock_path", SOCK], SHAPE),
    "the context twice": (["--config-file", CONF, "--privsep_context", SYSFS,
                           "--privsep_context", "acceld.privileged.tools",
                           "--privsep_sock_path", SOCK], SHAPE),
    "the socket before the context": (["--config-file", CONF, "--privsep_sock_path", SOCK,
                                       "--privsep_context", SYSFS], SHAPE),
    "a config dir": (["--config-dir", "/etc/acceld"] + good(), SHAPE),
    "-- then options": (good() + ["--", "--log-config-append"], SHAPE),
    "a word with spaces": (["--config-file", CONF, "--privsep_context", SYSFS,
                            "--privsep_sock_path " + SOCK], SHAPE),
    "a relative config file": (good("acceld.conf"), "normalised absolute path"),
    "a config file with ..": (good("/etc/acceld/../../tmp/x.conf"),
                              "normalised absolute path"),
    "a config file with //": (good("/etc/acceld//acceld.conf"), "normalised absolute path"),
    "an option as the config file": (good("--log-config-append"),
                                     "normalised absolute path"),
    "a config file named twice": (good(CONF, CONF), "named twice"),
    "a space in a path": (good("/etc/acceld/a b.conf"), "spaces or control"),
    "a newline in a path": (good("/etc/acceld/a\nb.conf"), "spaces or control"),
    "another module's context": (good(context="acceld.privileged.write_sysfs"),
                                 "must be one of"),
    "a context of another project": (good(context="os.system"), "must be one of"),
    "the socket as another file": (good(sock="/tmp/tmpabcd_123/x.ini"),
                                   "--privsep_sock_path must be"),
    "not mkdtemp's directory": (good(sock="/run/docker/privsep.sock"),
                                "--privsep_sock_path must be"),
    "upper case in the directory": (good(sock="/tmp/tmpABCD_123/privsep.sock"),
                                    "--privsep_sock_path must be"),
    "a relative socket": (good(sock="tmpabcd_123/privsep.sock"), "normalised absolute"),
    "a socket path too long": (good(sock="/" + "d" * 90 + "/tmpabcd_123/privsep.sock"),
                               "--privsep_sock_path must be"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_every_other_command_line_is_refused(case: str) -> None:
    argv, says = REFUSED[case]
    with pytest.raises(Refused) as raised:
        parse_argv(argv)
    assert says in str(raised.value)


# --- config files ---------------------------------------------------------------------

@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A directory root owns (0755) under /tmp, as /etc/acceld is."""
    path = Path(tempfile.mkdtemp(prefix="acceld-helper-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _conf(directory: Path, name: str = "acceld.conf", text: str = "[DEFAULT]\n") -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_root_s_config_files_are_read_by_their_resolved_path(root_dir: Path) -> None:
    conf = _conf(root_dir)
    (root_dir / "link.conf").symlink_to(conf)
    assert privsep_helper.trusted_config_files([str(conf), str(root_dir / "link.conf")]) \
        == [str(conf), str(conf)]


def test_a_config_file_others_may_write_is_refused(root_dir: Path) -> None:
    conf = _conf(root_dir)
    conf.chmod(0o664)
    with pytest.raises(Refused, match="writable by group or others"):
        privsep_helper.trusted_config_files([str(conf)])
    conf.chmod(0o644)
    root_dir.chmod(0o777)  # a directory above it, without the sticky bit
    with pytest.raises(Refused, match="writable by group or others"):
        privsep_helper.trusted_config_files([str(conf)])


@needs_root
def test_a_config_file_of_another_user_is_refused(root_dir: Path) -> None:
    conf = _conf(root_dir)
    os.chown(conf, OTHER, OTHER)
    with pytest.raises(Refused, match=f"owned by uid {OTHER}"):
        privsep_helper.trusted_config_files([str(conf)])
    # Nor by a link of root's pointing into another user's directory.
    theirs = root_dir / "theirs"
    theirs.mkdir()
    own = _conf(theirs)
    os.chown(theirs, OTHER, OTHER)
    (root_dir / "link.conf").symlink_to(own)
    with pytest.raises(Refused, match=f"owned by uid {OTHER}"):
        privsep_helper.trusted_config_files([str(root_dir / "link.conf")])


def test_only_regular_files_are_config_files(root_dir: Path) -> None:
    os.mkfifo(root_dir / "fifo.conf", 0o644)  # would block the reader
    (root_dir / "dir.conf").mkdir(mode=0o755)
    for name in ("fifo.conf", "dir.conf"):
        with pytest.raises(Refused, match="not a regular file"):
            privsep_helper.trusted_config_files([str(root_dir / name)])
    with pytest.raises(Refused, match="No such file"):
        privsep_helper.trusted_config_files([str(root_dir / "missing.conf")])


# --- the caller's credentials ---------------------------------------------------------

def test_the_caller_is_whom_sudo_names() -> None:
    assert privsep_helper.caller_credentials({"SUDO_UID": "1001", "SUDO_GID": "995"}) \
        == (1001, 995)
    assert privsep_helper.caller_credentials({"PATH": "/bin"}) is None  # root's own start
    for bad in ({"SUDO_UID": "1001"}, {"SUDO_UID": "", "SUDO_GID": "1"},
                {"SUDO_UID": "-1", "SUDO_GID": "1"}, {"SUDO_UID": "0x1", "SUDO_GID": "1"}):
        with pytest.raises(Refused, match="SUDO_UID and SUDO_GID must be numbers"):
            privsep_helper.caller_credentials(bad)


@needs_root
def test_root_connects_only_where_the_caller_may(tmp_path: Path) -> None:
    directory = Path(tempfile.mkdtemp())  # root's, 0700: as a root privsep client makes it
    listener = socket.socket(socket.AF_UNIX)
    groups = os.getgroups()
    try:
        listener.bind(str(directory / "privsep.sock"))
        listener.listen(2)
        with pytest.raises(PermissionError):
            privsep_helper.connect_as(str(directory / "privsep.sock"), (OTHER, OTHER))
        assert (os.geteuid(), os.getegid(), os.getgroups()) == (0, 0, groups)
        privsep_helper.connect_as(str(directory / "privsep.sock"), None).close()
        # The caller's own directory and socket: connected as the caller.
        os.chown(directory, OTHER, OTHER)
        os.chown(directory / "privsep.sock", OTHER, OTHER)
        privsep_helper.connect_as(str(directory / "privsep.sock"), (OTHER, OTHER)).close()
        assert (os.geteuid(), os.getegid(), os.getgroups()) == (0, 0, groups)
    finally:
        listener.close()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


# --- the command itself ---------------------------------------------------------------

def _helper(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    return subprocess.run([sys.executable, "-m", "acceld.cmd.privsep_helper", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def test_a_refused_command_line_starts_nothing_and_says_why(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ini = tmp_path / "evil.ini"
    ini.write_text("[loggers]\nkeys=root\n[handlers]\nkeys=h\n[formatters]\nkeys=\n"
                   "[logger_root]\nhandlers=h\n[handler_h]\nclass=StreamHandler\n"
                   f"args=(open({str(marker)!r}, 'w').write('x') and None,)\n")
    done = _helper(*good(), "--log-config-append", str(ini))
    assert done.returncode == 2
    assert done.stderr.startswith("acceld-privsep-helper: refused: expected --config-file")
    assert not marker.exists()


def test_a_socket_that_cannot_be_connected_ends_the_helper(root_dir: Path) -> None:
    done = _helper(*good(str(_conf(root_dir)), sock="/tmp/tmpnone_000/privsep.sock"))
    assert done.returncode == 1
    assert done.stderr.strip() == ("acceld-privsep-helper: cannot connect to "
                                   "/tmp/tmpnone_000/privsep.sock: No such file or directory")


@pytest.fixture
def helper_daemon(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """The sysfs context through this helper, started by root (this test) as the privsep
    client starts it, with a root-owned config that names, for logging, a file and a
    directory another user owns; yields that user's directory."""
    if os.geteuid() != 0:
        pytest.skip("starting a privsep daemon needs root")
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    for name in ("SUDO_UID", "SUDO_GID"):  # root starts it here, not a user through sudo
        monkeypatch.delenv(name, raising=False)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "logs").mkdir()
    marker = theirs / "ran"
    (theirs / "evil.ini").write_text(
        "[loggers]\nkeys=root\n[handlers]\nkeys=h\n[formatters]\nkeys=\n"
        "[logger_root]\nhandlers=h\n[handler_h]\nclass=StreamHandler\n"
        f"args=(open({str(marker)!r}, 'w').write('x') and None,)\n")
    for path in (theirs, theirs / "logs", theirs / "evil.ini"):
        os.chown(path, OTHER, OTHER)
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nlog_config_append = {theirs / 'evil.ini'}\n"
                    f"log_dir = {theirs / 'logs'}\nlog_file = helper.log\ndebug = true\n"
                    f"[nvidia_gpu]\nsysfs_root = {tmp_path / 'sys'}\n")
    context = privileged.sysfs
    cfg.CONF.set_override("helper_command",
                          f"{sys.executable} -m acceld.cmd.privsep_helper --config-file {conf}",
                          group=context.cfg_section)
    context.set_client_mode(True)
    try:
        yield theirs
    finally:
        if context.channel is not None:
            context.stop()
        context.set_client_mode(False)
        cfg.CONF.clear_override("helper_command", group=context.cfg_section)


@pytest.mark.slow
def test_the_daemon_reads_no_logging_config_a_root_file_names(
        tmp_path: Path, helper_daemon: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)  # the helper runs `-m` from this tree
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:06:00.0", "0x10de", "0x1eb8", "0x030200")
    tree.add_mdev_type("0000:06:00.0", "nvidia-1", "GRID T4-1B", 16)
    uuid = "2d7c3c0a-0000-4000-8000-000000000001"
    attribute = tree.add_mdev("0000:06:00.0", "nvidia-1", uuid) / "remove"
    privileged.write_sysfs(str(tree.root / "bus" / "mdev" / "devices" / uuid / "remove"), "1")
    assert attribute.read_text() == "1"
    assert privileged.sysfs.channel is not None  # it went through the daemon
    assert not (helper_daemon / "ran").exists()
    assert list((helper_daemon / "logs").iterdir()) == []
