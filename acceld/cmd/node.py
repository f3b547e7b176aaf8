"""The node-side `acceld` subcommands: `agent`, `driver NAME` and `status`."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from sqlalchemy import func, select, true

from acceld.cmd import common


def _load(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    conf = common.load(args)
    if getattr(args, "host", None):
        conf.set_override("host", args.host)
    return conf


def cmd_agent(args: argparse.Namespace) -> int:
    from acceld import logs, privileged
    from acceld.agent import service

    conf = _load(args)
    if args.port is not None:
        conf.set_override("port", args.port, group="agent")
    logs.setup(conf, "agent")
    privileged.configure(conf)  # root operations through privsep ([agent] privileged_calls)
    service.run(conf)
    return 0


def cmd_driver(args: argparse.Namespace) -> int:
    from acceld import logs, privileged
    from acceld.agent import driver_process
    from acceld.drivers import loader

    conf = _load(args)
    if args.port is not None:
        conf.set_override("port", args.port, group="driver")
    if args.agent_url:
        conf.set_override("agent_url", args.agent_url, group="driver")
    logs.setup(conf, f"driver-{args.name}")
    privileged.configure(conf)
    try:
        loader.driver_class(args.name)
    except loader.UnknownDriver as exc:
        print(f"acceld driver: {exc}", file=sys.stderr)
        return 2
    driver_process.run(conf, args.name)
    return 0


def format_status(rows, devices_by_host: dict[str, int], now) -> str:  # type: ignore[no-untyped-def]
    """The agents table as `acceld status` prints it."""
    lines = [f"{'HOST':<24} {'STATE':<6} {'LAST CONTACT (UTC)':<20} {'AGO':>8} "
             f"{'DEVICES':>7}  ENDPOINT"]
    for row in rows:
        ago = (now - row.last_seen_at).total_seconds()
        lines.append(f"{row.hostname:<24} {row.state:<6} "
                     f"{row.last_seen_at.isoformat(sep=' ', timespec='seconds'):<20} "
                     f"{ago:>7.0f}s {devices_by_host.get(row.hostname, 0):>7}  {row.endpoint}")
    if not rows:
        # No agent row: none has reported, or each that did was retired (acceld host
        # delete removes the row): either way, none is registered now.
        lines.append("(no agent registered: none has reported yet, or every host that "
                     "reported was retired with `acceld host delete`)")
    return "\n".join(lines) + "\n"


def format_health(rows) -> str:  # type: ignore[no-untyped-def]
    """Unhealthy and quarantined devices per host (docs/devices.md, Health); empty when none."""
    if not rows:
        return ""
    lines = ["", "Devices unhealthy or quarantined for their health:",
             f"{'HOST':<24} {'DEVICE':<36} {'TYPE':<6} {'HEALTH':<9} {'QUARANTINED':<11} "
             f"{'SINCE (UTC)':<20} REASON"]
    for row in rows:
        since = row.health_since.isoformat(sep=" ", timespec="seconds") \
            if row.health_since else "-"
        reason = (row.health_reason or "-").replace("\n", " ")
        lines.append(f"{row.hostname:<24} {row.uuid:<36} {row.type:<6} {row.health:<9} "
                     f"{'yes' if row.quarantined else 'no':<11} {since:<20} {reason}")
    return "\n".join(lines) + "\n"


def format_damaged(rows) -> str:  # type: ignore[no-untyped-def]
    """Bound ARQs that hold no device in acceld's records (acceld.cmd.arqs_check: an
    upgrade through migration 0005 on SQLite before issue 24's fix); empty when none."""
    if not rows:
        return ""
    lines = ["", "Bound accelerator requests that hold no device (repair: docs/arqs.md, "
                 "\"Bound ARQs without an attach handle\"):",
             f"{'HOST':<24} {'ARQ':<36} {'INSTANCE':<36} PROBLEM"]
    for uuid, instance, host, _rp, problem in rows:
        lines.append(f"{host or '-':<24} {uuid:<36} {instance or '-':<36} {problem}")
    return "\n".join(lines) + "\n"


def format_conductors(members, dead_after: float, hosts: list[str]) -> str:  # type: ignore[no-untyped-def]
    """The conductors sharing the database, live or not, and how many hosts the ring over
    the live ones gives each (acceld.conductor.fleet.membership)."""
    from acceld.conductor.fleet.hashring import HashRing

    if not members:
        return ""
    ring = HashRing(m.name for m in members if m.age <= dead_after)
    owned: dict[str | None, int] = {}
    for host in hosts:
        owner = ring.owner(host)
        owned[owner] = owned.get(owner, 0) + 1
    lines = ["", f"Conductors (live while heard from within {dead_after:.0f} s; the ring "
                 "over the live ones divides the hosts' periodic work; WRITTEN: how long "
                 "ago it last wrote the heartbeats it answered):",
             f"{'NAME':<32} {'STATE':<6} {'AGO':>8} {'WRITTEN':>8} {'HOSTS':>6}  URL"]
    for m in members:
        live = m.age <= dead_after
        lines.append(f"{m.name:<32} {'live' if live else 'gone':<6} {m.age:>7.0f}s "
                     f"{m.written_ago:>7.0f}s "
                     f"{owned.get(m.name, 0) if live else '-':>6}  {m.url or '-'}")
    return "\n".join(lines) + "\n"


# `acceld status` exit codes (2 is argparse's: a usage error).
STATUS_AGENT_DOWN = 1
STATUS_NO_DATABASE = 3
STATUS_OLD_SCHEMA = 4
STATUS_DAMAGED_ARQS = 5


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def cmd_status(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DBAPIError

    from acceld.cmd.arqs_check import damaged_bound_arqs
    from acceld.conductor.fleet.membership import dead_after
    from acceld.db import agents as agents_db
    from acceld.db import conductors as conductors_db
    from acceld.db import migrate
    from acceld.db.clock import db_now
    from acceld.db.engine import from_config
    from acceld.db.models import devices

    conf = _load(args)
    db = from_config(conf)
    try:
        migrate.check_current(db)  # tables of another release would be misread
        with db.read() as conn:
            rows = agents_db.list_agents(conn)
            counts = dict(conn.execute(select(devices.c.hostname, func.count()).group_by(
                devices.c.hostname)).all())
            now = db_now(conn)  # the clock that stamped last_seen_at, not this host's
            unwell = conn.execute(select(
                devices.c.hostname, devices.c.uuid, devices.c.type, devices.c.health,
                devices.c.health_reason, devices.c.health_since, devices.c.quarantined).where(
                (devices.c.health == "unhealthy") | (devices.c.quarantined == true()))
                .order_by(devices.c.hostname, devices.c.id)).all()
            damaged = damaged_bound_arqs(conn)
        members = conductors_db.members(db)
    except DBAPIError as exc:  # one clear line, not a traceback
        print(f"acceld status: cannot reach the database: {_first_line(exc.orig or exc)}",
              file=sys.stderr)
        return STATUS_NO_DATABASE
    except migrate.SchemaNotCurrent as exc:
        print(f"acceld status: {exc}", file=sys.stderr)
        return STATUS_OLD_SCHEMA
    finally:
        db.dispose()
    sys.stdout.write(format_status(rows, counts, now) + format_health(unwell) +
                     format_damaged(damaged) +
                     format_conductors(members, dead_after(conf),
                                       [r.hostname for r in rows]))
    if damaged:
        return STATUS_DAMAGED_ARQS
    return STATUS_AGENT_DOWN if any(r.state == "down" for r in rows) else 0


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("agent", help="Run the node agent (drivers, hardware, heartbeats).")
    common(p)
    p.add_argument("--port", type=int, help="Internal API port (default 6668).")
    p.add_argument("--host", help="Node name to report under (default [DEFAULT] host).")
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("driver", help="Run one driver as its own process (the Driver API).")
    common(p)
    p.add_argument("name", help="Driver name (an entry point in acceld.drivers).")
    p.add_argument("--port", type=int, help="Port to listen on (default: a free one).")
    p.add_argument("--host", help="Node name (default [DEFAULT] host).")
    p.add_argument("--agent-url", help="The agent to register with.")
    p.set_defaults(func=cmd_driver)

    p = sub.add_parser("status", help="List agents, their state and last contact, and the "
                                      "devices unhealthy or quarantined per host and any "
                                      "Bound ARQ that holds no device; exits 1 if any agent "
                                      "is down, 3 if the database cannot be reached, 4 if "
                                      "its schema is not current, 5 if a Bound ARQ holds "
                                      "no device.")
    common(p)
    p.set_defaults(func=cmd_status)
