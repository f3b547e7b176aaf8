"""The `acceld` command: one entry point for every service and admin task."""

from __future__ import annotations

import argparse
import logging
import sys

from oslo_config import cfg

from acceld import config, logs
from acceld.cmd import (claim, common, db, explain, host, internal, node, node_key, samples,
                        serve, simulate)

# The subcommand families, one module each, in the order `acceld --help` lists them; each
# registers its subcommands with register(subparsers, add_common_options). Their own
# imports wait until a subcommand runs: every service builds this parser.
LOG = logging.getLogger(__name__)

FAMILIES = (serve, db, samples, node, simulate, internal, host, node_key, explain, claim)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="acceld", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for family in FAMILIES:
        family.register(sub, common.options)
    return parser


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
        LOG.error("%s", line)
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
        LOG.error("acceld %s failed", command, exc_info=exc)
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
