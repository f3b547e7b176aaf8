"""`acceld config sample` and `acceld policy sample`: the sample config and policy files,
as the oslo generators make them (acceld.sample)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def cmd_config_sample(args: argparse.Namespace) -> int:
    from acceld.sample import config_sample

    sys.stdout.write(config_sample())
    return 0


def cmd_policy_sample(args: argparse.Namespace) -> int:
    from acceld.sample import policy_sample

    sys.stdout.write(policy_sample())
    return 0


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("config", help="Configuration helpers.")
    csub = p.add_subparsers(dest="config_command", required=True)
    q = csub.add_parser("sample", help="Print a commented sample config file.")
    q.set_defaults(func=cmd_config_sample)

    p = sub.add_parser("policy", help="Policy helpers.")
    psub = p.add_subparsers(dest="policy_command", required=True)
    q = psub.add_parser("sample", help="Print every policy rule with its default.")
    q.set_defaults(func=cmd_policy_sample)
