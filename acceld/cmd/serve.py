"""The controller services' `acceld` subcommands: `all` (every service on this machine),
`api` and `conductor`. The node's (`agent`, `driver NAME`) are in acceld.cmd.node."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld import logs
from acceld.cmd.common import load


def cmd_all(args: argparse.Namespace) -> int:
    from acceld.services import allinone, noauth_guard

    conf = load(args)
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

    conf = load(args)
    logs.setup(conf, "api")
    try:
        api_server.run(conf)
    except (noauth_guard.InsecureNoauth, SchemaNotCurrent) as exc:
        print(f"acceld api: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_conductor(args: argparse.Namespace) -> int:
    from acceld.conductor import service

    conf = load(args)
    if args.port:
        conf.set_override("port", args.port, group="conductor")
    logs.setup(conf, "conductor")
    service.run(conf)
    return 0


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("all", help="Run every service on this machine (the all-in-one).")
    common(p)
    p.add_argument("--port", type=int, metavar="P",
                   help="Move the all-in-one: the API listens on P and, unless their ports "
                        "are configured ([conductor] port, [agent] port), the conductor on "
                        "P+1 and the agent on P+2 (default 6666, 6667, 6668). A second "
                        "all-in-one on one machine: another --port and --state-path.")
    p.add_argument("--workers", type=int, help="API worker processes (default 2).")
    p.set_defaults(func=cmd_all)

    p = sub.add_parser("api", help="Serve the public REST API.")
    common(p)
    p.add_argument("--port", type=int, help="Public API port (default 6666).")
    p.add_argument("--workers", type=int, help="API worker processes.")
    p.set_defaults(func=cmd_api)

    p = sub.add_parser("conductor", help="Run the conductor (inventory, binds, Placement).")
    common(p)
    p.add_argument("--port", type=int, help="Internal API port (default 6667).")
    p.set_defaults(func=cmd_conductor)
