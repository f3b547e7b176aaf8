"""`acceld internal node-key HOSTNAME`: the key an operator gives to one node.

Run on a controller (it needs the cloud's secret, ``[internal] shared_secret``).
The node is configured with the printed key as ``[internal] node_key`` (or in
``node_key_file``) and never holds the cloud's secret, so it can speak for
itself only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld.internal import auth


def cmd_node_key(args: argparse.Namespace) -> int:
    from acceld.cli import _load
    from acceld.services.secrets import internal_secret

    if not auth.HOSTNAME.match(args.hostname):
        print(f"acceld internal node-key: not a host name: {args.hostname!r}", file=sys.stderr)
        return 2
    conf = _load(args)
    sys.stdout.write(auth.node_key(internal_secret(conf), args.hostname).decode() + "\n")
    return 0


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("internal", help="Internal API credentials.")
    isub = p.add_subparsers(dest="internal_command", required=True)
    q = isub.add_parser("node-key", help="Print the key of one node (its [DEFAULT] host), "
                                         "derived from [internal] shared_secret, for its "
                                         "[internal] node_key.")
    common(q)
    q.add_argument("hostname", help="The node's [DEFAULT] host, as its agent reports it.")
    q.set_defaults(func=cmd_node_key)
