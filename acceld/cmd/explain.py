"""`acceld explain PROFILE [--host H] [--project P] [--json]`: why a device profile can or cannot get an
accelerator, as ``GET /v2/device_profiles/{ident}/explain`` answers it.

Runs on a controller against the database and Placement named by the config file, as
`acceld host delete` does; the work is acceld.explain's. Exit status: 0 satisfiable,
1 not satisfiable, 2 unknown profile or bad host name.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import orjson

from acceld.cmd.common import load

SATISFIABLE, NOT_SATISFIABLE, UNKNOWN = 0, 1, 2


def cmd_explain(args: argparse.Namespace) -> int:
    from acceld import explain
    from acceld.api import arq_limits
    from acceld.api.handlers.explain import HOSTNAME_RE
    from acceld.clients import placement
    from acceld.db.engine import from_config
    from acceld.explain import text

    if args.host is not None and not HOSTNAME_RE.match(args.host):
        print(f"acceld explain: invalid host name {args.host!r}", file=sys.stderr)
        return UNKNOWN
    conf = load(args)
    db = from_config(conf)
    try:
        doc = explain.explain(
            db, placement.from_conf(conf), args.profile, args.host,
            reserve_down_agents=conf.conductor.reserve_devices_of_down_agents,
            project_id=args.project,
            quota=None if args.project is None else arq_limits.refuser(conf, args.project))
    except explain.ProfileNotFound as exc:
        print(f"acceld explain: {exc}", file=sys.stderr)
        return UNKNOWN
    finally:
        db.dispose()
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(text.render(doc))
    return SATISFIABLE if doc["satisfiable"] else NOT_SATISFIABLE


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("explain", help="Why a device profile can or cannot get an accelerator: "
                                       "Placement's view beside acceld's, per host.")
    common(p)
    p.add_argument("profile", help="The device profile's name or uuid.")
    p.add_argument("--host", help="Only this host (as its agent and Nova name it).")
    p.add_argument("--project", help="Also whether this project may create the profile's ARQs "
                                      "now ([quota]).")
    p.add_argument("--json", action="store_true", help="Print the API's JSON document.")
    p.set_defaults(func=cmd_explain)
