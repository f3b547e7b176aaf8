"""`acceld internal node-key HOSTNAME`: the key an operator gives to one node.

Run on a controller (it needs the cloud's secret, ``[internal] shared_secret``, and
reads the node's current key generation from the database: acceld.db.node_keys).
The node is configured with the printed key as ``[internal] node_key`` (or in
``node_key_file``) and never holds the cloud's secret, so it can speak for
itself only. A key of generation N > 0 is printed ``g<N>:<hex>``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld.cmd.common import load
from acceld.internal import auth


def cmd_node_key(args: argparse.Namespace) -> int:
    from acceld.runtime.secrets import internal_secret

    if not auth.HOSTNAME.match(args.hostname):
        print(f"acceld internal node-key: not a host name: {args.hostname!r}", file=sys.stderr)
        return 2
    conf = load(args)
    secret = internal_secret(conf)
    state = _key_state(conf, args.hostname)
    if state is None:
        return 1
    if state.revoked:
        print(f"acceld internal node-key: the key of node {args.hostname} is revoked; "
              f"`acceld node-key rotate {args.hostname}` gives it a new one.", file=sys.stderr)
        return 1
    key = auth.node_key(secret, args.hostname, state.generation)
    sys.stdout.write(auth.format_node_key(key, state.generation) + "\n")
    return 0


def _key_state(conf, hostname: str) -> auth.KeyState | None:  # type: ignore[no-untyped-def]
    """The node's current key generation; None (said why) if the database cannot say."""
    from sqlalchemy.exc import SQLAlchemyError

    from acceld.db import node_keys
    from acceld.db.engine import from_config

    db = from_config(conf)
    try:
        with db.read() as conn:
            return node_keys.read(conn, hostname)
    except SQLAlchemyError as exc:
        print(f"acceld internal node-key: cannot read node {hostname}'s key generation "
              f"({exc.__class__.__name__}): is the database reachable, and upgraded "
              "(`acceld db upgrade`)?", file=sys.stderr)
        return None
    finally:
        db.dispose()


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("internal", help="Internal API credentials.")
    isub = p.add_subparsers(dest="internal_command", required=True)
    q = isub.add_parser("node-key", help="Print the key of one node (its [DEFAULT] host) at "
                                         "its current generation, derived from [internal] "
                                         "shared_secret, for its [internal] node_key.")
    common(q)
    q.add_argument("hostname", help="The node's [DEFAULT] host, as its agent reports it.")
    q.set_defaults(func=cmd_node_key)
