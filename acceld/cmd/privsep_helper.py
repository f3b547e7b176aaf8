"""``acceld-privsep-helper``: the one command the ``acceld`` user may run as root
(etc/sudoers.d/acceld-privsep), which starts one of acceld's privsep daemons.

oslo.privsep's own ``privsep-helper`` hands whatever follows it on the command line to
oslo.config and then sets oslo.log up from the result, so a caller that can add one
argument chooses a logging config that root evaluates (``logging.config.fileConfig`` runs
a handler's ``args``), or a config file that names one. Everything here is decided before
anything is parsed, and nothing the caller can write is read:

* the command line is exactly ``--config-file PATH [--config-file PATH ...]
  --privsep_context NAME --privsep_sock_path SOCK``, what oslo.privsep appends to
  ``helper_command``: no other option, spelling (``--opt=value``), order or repetition;
  NAME is one of acceld's three contexts, SOCK has the form the privsep client makes
  (``<dir>/tmpXXXXXXXX/privsep.sock``);
* each config file (and every directory above it) is root's and writable by no one else
  (acceld.privileged.policy.check_trusted), and is then read by its resolved path; no
  environment (``OS_<GROUP>__<OPTION>``), no standard places, no ``--config-dir``;
* logging is never set up from the config (``log_config_append``, ``log_file``,
  ``log_dir``, syslog): standard error until the daemon forks (the privsep client logs
  it), then the privsep channel, as oslo.privsep's daemon does after its fork; only
  ``[DEFAULT] debug`` is read;
* the environment is replaced by a fixed ``PATH`` (the vendor tools inherit it), the
  working directory is ``/`` and the umask 022;
* the socket is connected with the credentials of the user who ran sudo (``SUDO_UID``,
  ``SUDO_GID``, which sudo sets and the rules let no one else set): root connects only
  where that user could connect itself, never to another service's socket;
* the daemon takes only its context's entry point, refusing any other call before anything
  is imported, and serves with umask 022 (:func:`_daemon_class`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from oslo_privsep.priv_context import PrivContext

# Only the standard library above: acceld's and oslo's modules are imported once main()
# has replaced the environment (nothing they run at import then sees the caller's PATH).

LOG = logging.getLogger(__name__)

PROG = "acceld-privsep-helper"
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# tempfile.mkdtemp()'s name (its 8 random characters) and oslo.privsep's socket name in it.
_SOCKET_DIR = re.compile(r"tmp[a-z0-9_]{8}")
_SOCKET_NAME = "privsep.sock"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path, less its terminating NUL


def contexts() -> dict[str, PrivContext]:
    """acceld's privsep contexts by the name privsep passes (``acceld.privileged.sysfs``,
    ``.tools``, ``.nvml``: the names the sudoers rules carry)."""
    from acceld import privileged

    return {context.pypath: context for context in privileged.CONTEXTS}


class Refused(ValueError):
    """A command line or config file the helper does not start a daemon for."""


@dataclass(frozen=True)
class Invocation:
    """What a command line asked for, once it has the one accepted shape."""

    config_files: tuple[str, ...]
    context: str
    sock_path: str


def _path(value: str, what: str) -> str:
    if not value.startswith("/") or os.path.normpath(value) != value or value == "/":
        raise Refused(f"{what} must be a normalised absolute path: {value!r}")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise Refused(f"{what} must not hold spaces or control characters: {value!r}")
    return value


def parse_argv(argv: Sequence[str]) -> Invocation:
    """The invocation ``argv`` (without the program name) asks for, when it is exactly
    ``(--config-file PATH)+ --privsep_context NAME --privsep_sock_path SOCK``."""
    args = list(argv)
    if len(args) < 6 or len(args) % 2:
        raise Refused(f"expected --config-file PATH ... --privsep_context NAME "
                      f"--privsep_sock_path SOCK, got {args!r}")
    pairs = [(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    *files, (context_flag, context), (sock_flag, sock) = pairs
    if any(flag != "--config-file" for flag, _ in files) or (
            context_flag, sock_flag) != ("--privsep_context", "--privsep_sock_path"):
        raise Refused(f"expected --config-file PATH ... --privsep_context NAME "
                      f"--privsep_sock_path SOCK, got {args!r}")
    config_files = tuple(_path(path, "--config-file") for _, path in files)
    if len(set(config_files)) != len(config_files):
        raise Refused(f"a config file is named twice: {list(config_files)!r}")
    if context not in contexts():
        raise Refused(f"--privsep_context must be one of {', '.join(sorted(contexts()))}: "
                      f"{context!r}")
    sock = _path(sock, "--privsep_sock_path")
    directory, name = os.path.split(sock)
    if name != _SOCKET_NAME or not _SOCKET_DIR.fullmatch(os.path.basename(directory)) \
            or len(sock.encode()) > _SUN_PATH_MAX:
        raise Refused(f"--privsep_sock_path must be <directory>/tmpXXXXXXXX/{_SOCKET_NAME} "
                      f"(as the privsep client makes it): {sock!r}")
    return Invocation(config_files, context, sock)


def trusted_config_files(paths: Sequence[str]) -> list[str]:
    """Each path resolved, when it is a regular file that it and every directory above it
    are root's and writable by no one else: what is then parsed."""
    from acceld.privileged.policy import NotAllowed, check_trusted

    out = []
    for path in paths:
        try:
            real = check_trusted(path, "config file")
        except NotAllowed as exc:
            raise Refused(str(exc)) from None
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise Refused(f"config file {path!r} is not a regular file")
        out.append(real)
    return out


def caller_credentials(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(uid, gid) of the user who ran sudo, from ``SUDO_UID``/``SUDO_GID``, which sudo
    sets itself (the rules' ``!setenv`` refuses ``sudo SUDO_UID=0 ...``, and a kept
    variable is overwritten); None without them: root started the helper, its own
    credentials connect. Not the parent's uid: the caller may kill sudo, and the helper's
    parent is then init."""
    uid, gid = environ.get("SUDO_UID"), environ.get("SUDO_GID")
    if uid is None and gid is None:
        return None
    if not (uid and gid and uid.isdigit() and gid.isdigit()):
        raise Refused(f"SUDO_UID and SUDO_GID must be numbers: {uid!r}, {gid!r}")
    return int(uid), int(gid)


def connect_as(path: str, credentials: tuple[int, int] | None) -> socket.socket:
    """A Unix socket connected to ``path`` with the caller's uid and gid (no supplementary
    groups) in force, so the kernel checks the caller's rights on every directory and on
    the socket itself; the helper's own credentials are back in force after."""
    if credentials is None or os.geteuid() != 0:
        return _connect(path)
    uid, gid = credentials
    groups, egid = os.getgroups(), os.getegid()
    try:
        os.setgroups([])
        os.setegid(gid)
        os.seteuid(uid)
        return _connect(path)
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def entry_points(context: PrivContext) -> frozenset[str]:
    """The names a privsep client sends for ``context``'s entry points (``module.function``,
    as oslo.privsep's PrivContext names a call): the only calls its daemon takes."""
    import functools

    from acceld import privileged

    functions = [value.args[0] if isinstance(value, functools.partial) else value
                 for value in vars(privileged).values() if context.is_entrypoint(value)]
    return frozenset(f"{func.__module__}.{func.__name__}" for func in functions)


def _daemon_class():  # type: ignore[no-untyped-def]
    """oslo.privsep's Daemon with two of its habits removed, both of which let the caller
    reach root's interpreter: it imports whatever module a call names before asking
    whether the function is an entry point (root then runs that module, and caches its
    bytecode), and it serves with umask 0 (every file and directory root then creates,
    a ``__pycache__`` of such an import or a vendor tool's file, is writable by anyone,
    so the caller could plant bytecode that root's next import runs)."""
    from oslo_privsep import comm, daemon

    class Daemon(daemon.Daemon):
        def __init__(self, channel: comm.ServerChannel, context: PrivContext) -> None:
            super().__init__(channel, context)
            self.entry_points = entry_points(context)

        def _drop_privs(self) -> None:
            super()._drop_privs()
            os.umask(0o022)  # run() set 0 just before; this runs before the first call

        def _process_cmd(self, msgid: str, cmd: comm.Message, *args: object) -> tuple:
            if cmd == comm.Message.CALL:
                name = args[0] if args else None
                if not isinstance(name, str) or name not in self.entry_points:
                    return (comm.Message.ERR.value, "builtins.NameError",
                            (f"not an entry point of {self.context.pypath}: {name!r}",), "")
            return super()._process_cmd(msgid, cmd, *args)

    return Daemon


def _load_config(files: Sequence[str]) -> None:
    """The global config from ``files`` alone (no environment, no standard places)."""
    from oslo_config import cfg

    from acceld.conf import default

    default.register_opts(cfg.CONF)  # for [DEFAULT] debug; no logging is set up from them
    cfg.CONF(args=[], project="acceld", prog=PROG, default_config_files=list(files),
             default_config_dirs=[], use_env=False, validate_default_values=True)


def _serve(invocation: Invocation, files: Sequence[str],
           credentials: tuple[int, int] | None) -> int:
    """oslo.privsep's helper from its parsed options on (oslo_privsep.daemon.helper_main):
    connect, fork; the child serves until the client goes away, the parent returns 0 (1
    when the socket cannot be connected)."""
    from oslo_config import cfg
    from oslo_privsep import comm, daemon

    _load_config(files)
    logging.getLogger().setLevel(logging.DEBUG if cfg.CONF.debug else logging.INFO)
    context = contexts()[invocation.context]
    try:
        sock = connect_as(invocation.sock_path, credentials)
    except OSError as exc:
        print(f"{PROG}: cannot connect to {invocation.sock_path}: {exc.strerror}",
              file=sys.stderr)
        return 1
    daemon.set_cloexec(sock)
    channel = comm.ServerChannel(sock)
    if os.fork() != 0:
        return 0
    daemon.replace_logging(daemon.PrivsepLogHandler(channel))
    LOG.info("privsep daemon starting")
    try:
        _daemon_class()(channel, context).run()
    except Exception as exc:  # noqa: BLE001 (oslo.privsep's helper does the same)
        LOG.exception(exc)
        sys.exit(str(exc))
    LOG.debug("privsep daemon exiting")
    sys.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the daemon ``argv`` asks for, or refuse (exit status 2) saying why."""
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = dict(os.environ)
    os.environ.clear()
    os.environ["PATH"] = SAFE_PATH
    os.umask(0o022)
    os.chdir("/")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"{PROG}: %(levelname)s %(message)s")
    try:
        invocation = parse_argv(argv)
        credentials = caller_credentials(environ)
        files = trusted_config_files(invocation.config_files)
    except Refused as exc:
        print(f"{PROG}: refused: {exc}", file=sys.stderr)
        return 2
    return _serve(invocation, files, credentials)


if __name__ == "__main__":
    sys.exit(main())
