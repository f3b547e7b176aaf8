"""`acceld simulate`: many node agents against a real conductor (scale tests;
acceld.cmd.simulator)."""

from __future__ import annotations

import argparse
from typing import Callable

from acceld import logs
from acceld.cmd.common import load


def cmd_simulate(args: argparse.Namespace) -> int:
    from acceld.cmd import simulator

    conf = load(args)
    logs.setup(conf, "simulate")
    return simulator.main_from_cli(conf, args)


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    # Its arguments here, not in acceld.cmd.simulator: every service builds this parser,
    # and the simulator's imports (the fake driver, jsonschema) would stay in each of them.
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
