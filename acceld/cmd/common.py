"""What every `acceld` subcommand shares: the configuration options on its command line
and loading the configuration they name."""

from __future__ import annotations

import argparse

from oslo_config import cfg

from acceld import config


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE",
                        help="INI config file (repeatable; later files win). Without "
                             "--config-file and --config-dir: acceld.conf where oslo.config "
                             "looks (~/.acceld/, ~/, /etc/acceld/, /etc/) and acceld.conf.d/ "
                             "there.")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="Directory of *.conf files read after the config files, in "
                             "name order (repeatable).")
    parser.add_argument("--state-path", help="Override [DEFAULT] state_path.")


def load(args: argparse.Namespace) -> cfg.ConfigOpts:
    conf = config.load(config_files=args.config_file,
                       config_dirs=getattr(args, "config_dir", None), discover=True)
    if getattr(args, "state_path", None):
        conf.set_override("state_path", args.state_path)
    if getattr(args, "port", None) and args.command in ("api", "all"):
        conf.set_override("port", args.port, group="api")
    if getattr(args, "workers", None):
        conf.set_override("workers", args.workers, group="api")
    return conf
