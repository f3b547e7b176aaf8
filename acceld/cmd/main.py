"""The `acceld` command: one entry point for every service and admin task."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from oslo_config import cfg

from acceld import config, logs


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE",
                        help="INI config file (repeatable; later files win). Without "
                             "--config-file and --config-dir: acceld.conf where oslo.config "
                             "looks (~/.acceld/, ~/, /etc/acceld/, /etc/) and acceld.conf.d/ "
                             "there.")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="Directory of *.conf files read after the config files, in "
                             "name order (repeatable).")
    parser.add_argument("--state-path", help="Override [DEFAULT] state_path.")


def _load(args: argparse.Namespace) -> cfg.ConfigOpts:
    conf = config.load(config_files=args.config_file,
                       config_dirs=getattr(args, "config_dir", None), discover=True)
    if getattr(args, "state_path", None):
        conf.set_override("state_path", args.state_path)
    if getattr(args, "port", None) and args.command in ("api", "all"):
        conf.set_override("port", args.port, group="api")
    if getattr(args, "workers", None):
        conf.set_override("workers", args.workers, group="api")
    return conf


def cmd_all(args: argparse.Namespace) -> int:
    from acceld.services import allinone, noauth_guard

    conf = _load(args)
    logs.setup(conf, "all")
    try:
        # Refuse before anything starts; the API process checks again and warns.
        noauth_guard.check(conf, warn=False)
    except noauth_guard.InsecureNoauth as exc:
        print(f"acceld all: {exc}", file=sys.stderr)
        return 2
    from acceld.db.migrate import UnknownRevision

    try:
        return allinone.run(conf, list(conf.config_file), list(conf.config_dir or []),
                            base_port=args.port)
    except UnknownRevision as exc:  # a newer release's database: nothing started
        print(f"acceld all: {exc}", file=sys.stderr)
        return 2


def cmd_api(args: argparse.Namespace) -> int:
    from acceld.db.migrate import SchemaNotCurrent
    from acceld.services import api_server, noauth_guard

    conf = _load(args)
    logs.setup(conf, "api")
    try:
        api_server.run(conf)
    except (noauth_guard.InsecureNoauth, SchemaNotCurrent) as exc:
        print(f"acceld api: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_conductor(args: argparse.Namespace) -> int:
    from acceld.conductor import service

    conf = _load(args)
    if args.port:
        conf.set_override("port", args.port, group="conductor")
    logs.setup(conf, "conductor")
    service.run(conf)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from acceld.db import migrate
    from acceld.db.engine import from_config

    conf = _load(args)
    logs.setup(conf, "db")
    db = from_config(conf)
    phase = migrate.EXPAND if args.expand else migrate.CONTRACT if args.contract else None
    try:
        applied = migrate.upgrade(db, phase=phase)
    except migrate.ContractPending as exc:
        print(f"acceld db upgrade: {exc}", file=sys.stderr)
        print(f"database at revision {migrate.current_revision(db)}")
        return 3
    except migrate.UnknownRevision as exc:
        print(f"acceld db upgrade: {exc}", file=sys.stderr)
        return 4
    if applied:
        print(f"applied {len(applied)} migration(s): "
              + ", ".join(f"{m.revision} ({m.phase})" for m in applied))
    print(f"database at revision {migrate.current_revision(db)}")
    if phase == migrate.EXPAND:
        left = migrate.pending(db)
        if left:
            print(f"contract migration(s) left: {', '.join(m.revision for m in left)}: run "
                  "`acceld db upgrade --contract` once every service runs this release")
    return 0


def cmd_db_import_cyborg(args: argparse.Namespace) -> int:
    import os

    from sqlalchemy.engine import make_url

    from acceld.db import cyborg_import
    from acceld.db.engine import from_config

    conf = _load(args)
    logs.setup(conf, "db")
    url = make_url(config.database_url(conf))
    absent = url.get_backend_name() == "sqlite" and not os.path.exists(url.database or "")
    # A dry run creates nothing, not even the SQLite file's directory.
    db = None if args.dry_run and absent else from_config(conf)
    try:
        lines = cyborg_import.run(args.source, db, dry_run=args.dry_run)
    except cyborg_import.ImportRefused as exc:
        print(f"acceld db import-cyborg: {exc}", file=sys.stderr)
        return 1
    finally:
        if db is not None:
            db.dispose()
    print("\n".join(lines))
    return 0


def cmd_db_cyborg_changes(args: argparse.Namespace) -> int:
    from acceld.db import cyborg_changes, cyborg_import
    from acceld.db.engine import from_config

    conf = _load(args)
    logs.setup(conf, "db")
    db = from_config(conf)
    try:
        found = cyborg_changes.changes(args.source, db)
    except cyborg_import.ImportRefused as exc:
        print(f"acceld db cyborg-changes: {exc}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print("\n".join(cyborg_changes.report(found)))
    return 0


def cmd_db_version(args: argparse.Namespace) -> int:
    from acceld.cmd import db as db_version

    return db_version.cmd_db_version(args)


def cmd_config_sample(args: argparse.Namespace) -> int:
    from acceld.sample import config_sample

    sys.stdout.write(config_sample())
    return 0


def cmd_policy_sample(args: argparse.Namespace) -> int:
    from acceld.sample import policy_sample

    sys.stdout.write(policy_sample())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="acceld", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("all", help="Run every service on this machine (the all-in-one).")
    _common(p)
    p.add_argument("--port", type=int, metavar="P",
                   help="Move the all-in-one: the API listens on P and, unless their ports "
                        "are configured ([conductor] port, [agent] port), the conductor on "
                        "P+1 and the agent on P+2 (default 6666, 6667, 6668). A second "
                        "all-in-one on one machine: another --port and --state-path.")
    p.add_argument("--workers", type=int, help="API worker processes (default 2).")
    p.set_defaults(func=cmd_all)

    p = sub.add_parser("api", help="Serve the public REST API.")
    _common(p)
    p.add_argument("--port", type=int, help="Public API port (default 6666).")
    p.add_argument("--workers", type=int, help="API worker processes.")
    p.set_defaults(func=cmd_api)

    p = sub.add_parser("conductor", help="Run the conductor (inventory, binds, Placement).")
    _common(p)
    p.add_argument("--port", type=int, help="Internal API port (default 6667).")
    p.set_defaults(func=cmd_conductor)

    p = sub.add_parser("db", help="Database administration.")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    q = dbsub.add_parser("upgrade", help="Migrate the schema to the latest version (idempotent): "
                                         "expand and contract migrations both, or one phase "
                                         "(docs/upgrades.md).")
    _common(q)
    phase = q.add_mutually_exclusive_group()
    phase.add_argument("--expand", action="store_true",
                       help="Apply only the expand migrations (they only add; safe while "
                            "services of the previous release run), up to the first contract "
                            "migration.")
    phase.add_argument("--contract", action="store_true",
                       help="Apply every migration left (contract ones drop or change what "
                            "the previous release used): once every service is upgraded.")
    q.set_defaults(func=cmd_db_upgrade)
    q = dbsub.add_parser("import-cyborg", help="Import a stopped upstream Cyborg 17's database "
                                               "into acceld's [database] (empty), keeping every "
                                               "uuid; upstream's is only read.")
    _common(q)
    q.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="SQLAlchemy URL of upstream's database (its [database] connection).")
    q.add_argument("--dry-run", action="store_true",
                   help="Print what would be imported and what cannot be carried over; "
                        "change nothing.")
    q.set_defaults(func=cmd_db_import_cyborg)
    q = dbsub.add_parser("cyborg-changes", help="After an import, list by instance the ARQs "
                                                "acceld holds differently from upstream's "
                                                "database (before going back to upstream); "
                                                "upstream's is only read.")
    _common(q)
    q.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="SQLAlchemy URL of upstream's database (the one imported).")
    q.set_defaults(func=cmd_db_cyborg_changes)
    q = dbsub.add_parser("version", help="Print the database's schema revision and this "
                                         "release's (head); exit status 0: up to date, 3: "
                                         "`acceld db upgrade` needed, 4: a revision this "
                                         "release does not know (a newer release's), "
                                         "5: expanded, contract migrations left.")
    _common(q)
    q.set_defaults(func=cmd_db_version)

    p = sub.add_parser("config", help="Configuration helpers.")
    csub = p.add_subparsers(dest="config_command", required=True)
    q = csub.add_parser("sample", help="Print a commented sample config file.")
    q.set_defaults(func=cmd_config_sample)

    p = sub.add_parser("policy", help="Policy helpers.")
    psub = p.add_subparsers(dest="policy_command", required=True)
    q = psub.add_parser("sample", help="Print every policy rule with its default.")
    q.set_defaults(func=cmd_policy_sample)

    for register in EXTRA_COMMANDS:
        register(sub, _common)
    return parser


# Later services (conductor, agent, driver, status, simulate) register their subcommands here:
# each is a function(subparsers, add_common_options).
EXTRA_COMMANDS: list[Callable[..., None]] = []


def _node_commands(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import node as node_cli  # agent, driver NAME, status

    node_cli.register(sub, common)


EXTRA_COMMANDS.append(_node_commands)


def cmd_simulate(args: argparse.Namespace) -> int:
    from acceld import simulate

    conf = _load(args)
    logs.setup(conf, "simulate")
    return simulate.main_from_cli(conf, args)


def _simulate_command(sub, common) -> None:  # type: ignore[no-untyped-def]
    # Its arguments here, not in acceld.simulate: every service builds this parser, and the
    # simulator's imports (the fake driver, jsonschema) would stay in each of them.
    parser = sub.add_parser("simulate", help="Simulate many node agents against a real "
                                             "conductor (scale tests).")
    common(parser)
    parser.add_argument("--agents", type=int, default=100, help="Simulated nodes (default 100).")
    parser.add_argument("--devices-per-agent", type=int, default=8,
                        help="Fake devices per node (default 8).")
    parser.add_argument("--attach-handles", type=int, default=1,
                        help="Attach handles per device (default 1, a passthrough device).")
    parser.add_argument("--conductor-url",
                        help="One conductor URL, or several separated by commas (agents are "
                             "spread over them and fail over to the next). Default: from "
                             "[conductor] url (a list) or host_ip/port.")
    parser.add_argument("--heartbeat-interval", type=float,
                        help="Seconds between hellos (default [agent] heartbeat_interval).")
    parser.add_argument("--connections", type=int, default=0,
                        help="Kept-alive connections per conductor the hellos share "
                             "(default: --threads).")
    parser.add_argument("--threads", type=int, default=8,
                        help="Older name of --connections (default 8).")
    parser.add_argument("--status-every", type=float, default=0.0,
                        help="Print a status line every this many seconds (0: never).")
    parser.add_argument("--hold-seconds", type=float, default=0.0,
                        help="After the other phases, heartbeats only for this long.")
    parser.add_argument("--hostname-prefix", default="sim")
    parser.add_argument("--register-timeout", type=float, default=600.0)
    parser.add_argument("--steady-seconds", type=float, default=0.0,
                        help="Heartbeats only, no change, for this long (0: skip).")
    parser.add_argument("--churn-seconds", type=float, default=0.0,
                        help="Change devices for this long (0: skip).")
    parser.add_argument("--change-percent", type=float, default=1.0,
                        help="Share of all devices changed per round (default 1%%).")
    parser.add_argument("--change-every", type=float, default=10.0,
                        help="Seconds between change rounds (default 10).")
    parser.set_defaults(func=cmd_simulate)


EXTRA_COMMANDS.append(_simulate_command)


def _internal_commands(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import internal as internal_cli  # internal node-key HOSTNAME

    internal_cli.register(sub, common)


EXTRA_COMMANDS.append(_internal_commands)


def _host_commands(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import host as host_cli  # host delete NAME [--force]

    host_cli.register(sub, common)


EXTRA_COMMANDS.append(_host_commands)


def _node_key_commands(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import node_key as node_key_cli  # node-key rotate|revoke HOST

    node_key_cli.register(sub, common)


EXTRA_COMMANDS.append(_node_key_commands)


def _explain_command(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import explain as explain_cli  # explain PROFILE [--host H]

    explain_cli.register(sub, common)


EXTRA_COMMANDS.append(_explain_command)


def _claim_commands(sub, common) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd import claim as claim_cli  # claim PROFILE [--host H]; release ARQ...

    claim_cli.register(sub, common)


EXTRA_COMMANDS.append(_claim_commands)


def main(argv: list[str] | None = None) -> int:
    from acceld.runtime.lifecycle import die_with_parent

    die_with_parent()  # a service `acceld all` started does not outlive it
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        refusal = exc.code  # a service refusing to start (a missing node key, ...)
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line on stderr
        line = _operator_error(args, exc)
        if line is not None:
            print(f"acceld {args.command}: {line}", file=sys.stderr)
            return 2
        return _failed(" ".join(filter(None, (args.command, getattr(args, "db_command", None)))),
                       exc)
    # (outside the handler, so that the log line carries no exception of its own)
    prefix = f"acceld {args.command}: "
    # A refusal already naming its program (logs.setup's `acceld-db: ...`) keeps that name.
    named = refusal.startswith((prefix, f"{logs.PRODUCT}-"))
    line = refusal if named else prefix + refusal
    if logs.log_files():
        logging.getLogger("acceld.cmd.main").error("%s", line)
    print(line, file=sys.stderr)
    return 1


def _failed(command: str, exc: Exception) -> int:
    """An unexpected failure (a service that cannot start, a bug): the traceback to the
    log (oslo.log's file where log_file or log_dir is set, stderr otherwise) and one line
    naming it to stderr, so that an operator starting a service by hand, whose log goes to
    a file, still sees why it stopped. Exit status 1."""
    import traceback

    summary = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    files = logs.log_files()
    if logging.getLogger().handlers:
        logging.getLogger("acceld.cmd.main").error("acceld %s failed", command, exc_info=exc)
    else:  # logging not set up yet (the configuration did not load)
        traceback.print_exception(exc, file=sys.stderr)
    where = f" (traceback in {', '.join(files)})" if files else ""
    print(f"acceld {command}: failed: {summary}{where}", file=sys.stderr)
    return 1


def _operator_error(args: argparse.Namespace, exc: Exception) -> str | None:
    """The one line for an error an operator fixes (a missing database driver, a port
    another process holds), rather than a traceback; None for anything else."""
    import errno

    from acceld.db.engine import MissingDatabaseDriver
    from acceld.services import ports

    from acceld.db.migrate import UpstreamCyborgDatabase

    if isinstance(exc, (MissingDatabaseDriver, ports.PortProblem, UpstreamCyborgDatabase)):
        return str(exc)
    if isinstance(exc, cfg.Error):  # an option's bad value, a file that does not parse
        return str(exc).splitlines()[0]
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return ports.describe_in_use(config.CONF, args.command, exc)
    return None


if __name__ == "__main__":
    sys.exit(main())
