"""`acceld node-key rotate|revoke HOST`: replace or revoke one node's key alone.

Runs on a controller against the database named by the config file (as `acceld host
delete` does) and needs the cloud's secret to print the new key. The work is
acceld.db.node_keys'; every conductor refuses the node's old key within
``[internal] credential_ttl`` seconds (their reading of the table is never older).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld.cmd.common import load
from acceld.internal import auth

# Exit statuses: done, could not be done (database), unknown host or bad name.
OK, FAILED, UNKNOWN = 0, 1, 2


def rotated(hostname: str, state: auth.KeyState, key: str, ttl: int) -> str:
    """What `rotate` prints: what happened, what the operator does on the node, the key."""
    older = "generation 0" if state.generation == 1 else \
        f"generations 0 to {state.generation - 1}"
    return (f"Node key of host {hostname} rotated to generation {state.generation}: every "
            f"conductor refuses {older} within {ttl} s ([internal] credential_ttl) and signs "
            f"its calls to the node's agent with generation {state.generation}.\n"
            f"On host {hostname}: set [internal] node_key to the key below (or write it, "
            "alone, to the file [internal] node_key_file names, mode 0600), then restart "
            "its acceld agent and driver processes. Until then the node and the "
            "conductors refuse each other's calls and its agent is marked down once its "
            "hellos have failed for [conductor] agent_down_intervals heartbeats.\n"
            f"{key}\n")


def revoked(hostname: str, state: auth.KeyState, ttl: int) -> str:
    """What `revoke` prints."""
    return (f"Node key of host {hostname} revoked (generation {state.generation} and every "
            f"earlier one): every conductor refuses its calls within {ttl} s ([internal] "
            "credential_ttl), and no conductor calls its agent. Its agent is marked down "
            "once its hellos have failed for [conductor] agent_down_intervals heartbeats; "
            f"its devices stay in the inventory (`acceld host delete {hostname}` retires "
            "them).\n"
            f"To re-key the node: `acceld node-key rotate {hostname}`, and deploy the key "
            "it prints.\n")


def _run(args: argparse.Namespace, rotate: bool) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from acceld.db import node_keys
    from acceld.db.engine import from_config
    from acceld.runtime.secrets import internal_secret

    name = f"acceld node-key {'rotate' if rotate else 'revoke'}"
    if not auth.HOSTNAME.match(args.hostname):
        print(f"{name}: not a host name: {args.hostname!r}", file=sys.stderr)
        return UNKNOWN
    conf = load(args)
    secret = internal_secret(conf) if rotate else None  # before anything changes
    db = from_config(conf)
    try:
        change = node_keys.rotate if rotate else node_keys.revoke
        state = change(db, args.hostname)
    except node_keys.HostUnknown as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return UNKNOWN
    except SQLAlchemyError as exc:
        print(f"{name}: the database cannot be written ({exc.__class__.__name__}): nothing "
              "changed. Is it reachable, and upgraded (`acceld db upgrade`)?", file=sys.stderr)
        return FAILED
    finally:
        db.dispose()
    ttl = conf.internal.credential_ttl
    if secret is None:
        sys.stdout.write(revoked(args.hostname, state, ttl))
    else:
        key = auth.node_key(secret, args.hostname, state.generation)
        sys.stdout.write(rotated(args.hostname, state,
                                 auth.format_node_key(key, state.generation), ttl))
    return OK


def cmd_rotate(args: argparse.Namespace) -> int:
    return _run(args, rotate=True)


def cmd_revoke(args: argparse.Namespace) -> int:
    return _run(args, rotate=False)


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("node-key", help="Rotate or revoke one node's internal key.")
    nsub = p.add_subparsers(dest="node_key_command", required=True)
    q = nsub.add_parser("rotate", help="Give a node a new key (the next generation) and "
                                       "print it: its earlier keys are refused.")
    common(q)
    q.add_argument("hostname", help="The node's [DEFAULT] host, as its agent reports it.")
    q.set_defaults(func=cmd_rotate)
    q = nsub.add_parser("revoke", help="Refuse every key of a node (a lost or compromised "
                                       "node) until it is rotated.")
    common(q)
    q.add_argument("hostname", help="The node's [DEFAULT] host, as its agent reports it.")
    q.set_defaults(func=cmd_revoke)
