"""`acceld host delete NAME [--force]`: retire a host whose agent will never return.

Runs against the database named by the config file, as `acceld status` and
`acceld db upgrade` do (on a controller); the work is acceld.db.host_retire's, the
same as ``DELETE /v2/hosts/{hostname}``. Placement providers are removed by the
conductor's next sync pass, so the command works while Placement is away.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld.cmd.common import load

# Exit statuses: done, refused (agent up or ARQs bound there), unknown host.
OK, REFUSED, UNKNOWN = 0, 1, 2


def summary(retired) -> str:  # type: ignore[no-untyped-def]
    """What the command prints once the host is retired."""
    lines = [f"Host {retired.hostname} retired: "
             f"{'agent record, ' if retired.agent else ''}"
             f"{retired.devices} device(s), {retired.deployables} deployable(s), "
             f"{retired.attach_handles} attach handle(s) and {retired.handle_releases} queued "
             "release(s) removed.",
             f"{retired.providers} Placement provider(s) will be removed by the conductor's "
             "next sync pass (kept, fully reserved, while instances hold allocations there)."]
    for arq, instance in retired.failed_arqs:
        lines.append(f"ARQ {arq} of instance {instance} is now BindFailed (its device is gone).")
    return "\n".join(lines) + "\n"


def cmd_host_delete(args: argparse.Namespace) -> int:
    from acceld.db import host_retire
    from acceld.db.engine import from_config

    conf = load(args)
    db = from_config(conf)
    try:
        retired = host_retire.retire(db, args.hostname, force=args.force)
    except host_retire.HostNotFound as exc:
        print(f"acceld host delete: {exc}", file=sys.stderr)
        return UNKNOWN
    except host_retire.HostInUse as exc:
        print(f"acceld host delete: {exc.message}", file=sys.stderr)
        return REFUSED
    finally:
        db.dispose()
    sys.stdout.write(summary(retired))
    return OK


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("host", help="Manage hosts (compute nodes) acceld knows.")
    hsub = p.add_subparsers(dest="host_command", required=True)
    q = hsub.add_parser("delete", help="Retire a host whose agent will never return: remove "
                                       "its inventory, agent record and Placement providers.")
    common(q)
    q.add_argument("hostname", help="The host, as its agent reported it ([DEFAULT] host).")
    q.add_argument("--force", action="store_true",
                   help="Also when its agent is up or ARQs are bound there (they end "
                        "BindFailed).")
    q.set_defaults(func=cmd_host_delete)
