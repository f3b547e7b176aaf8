"""Sample config and policy files, made by the oslo generators from the code, and the
subcommands that print them.

``acceld config sample`` is ``oslo-config-generator`` over :data:`NAMESPACES` (the
same list as etc/acceld/acceld-config-generator.conf), and ``acceld policy
sample`` is ``oslopolicy-sample-generator --namespace acceld``: one source of
truth, so that etc/acceld/*.sample (kept in sync by the tests) and what an
operator generates with the oslo tools cannot differ.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from typing import Callable

from oslo_config import cfg

# acceld's own options (acceld.conf.opts.list_opts, with keystoneauth's for [placement],
# [nova] and [glance]) and those of the libraries acceld configures.
NAMESPACES = (
    "acceld",
    "keystonemiddleware.auth_token",
    "oslo.limit",
    "oslo.policy",
    "oslo.middleware.healthcheck",
    "oslo.middleware.http_proxy_to_wsgi",
    "oslo.middleware.cors",
)
WRAP_WIDTH = 79


def config_sample(namespaces: tuple[str, ...] = NAMESPACES) -> str:
    """The commented sample acceld.conf, every option at its default."""
    from oslo_config import generator as config_generator  # (only this command loads it)

    conf = cfg.ConfigOpts()
    config_generator.register_cli_opts(conf)
    args = [f"--namespace={ns}" for ns in namespaces] + [f"--wrap-width={WRAP_WIDTH}"]
    conf(args, project="acceld", default_config_files=[], default_config_dirs=[])
    out = io.StringIO()
    config_generator.generate(conf, output_file=out)
    return out.getvalue()


def policy_sample() -> str:
    """Every rule as YAML (oslo.policy's sample format): description, operations, scope,
    the default (commented out) and, for a replaced rule, the deprecated one."""
    from oslo_policy import generator as policy_generator

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "policy.yaml.sample")
        policy_generator.generate_sample(
            args=["--namespace", "acceld", "--output-file", path],
            conf=cfg.ConfigOpts())
        with open(path) as f:
            return f.read()


def cmd_config_sample(args: argparse.Namespace) -> int:
    sys.stdout.write(config_sample())
    return 0


def cmd_policy_sample(args: argparse.Namespace) -> int:
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
