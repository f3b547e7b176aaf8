"""Print one driver's discovery as JSON: ``python -m acceld.drivers.show NAME``.

For operators and driver authors checking what a driver reports on a node,
without an agent or a conductor. Options come from ``--config-file`` and the
environment (``OS_NVIDIA_GPU__USE_NVML=false`` turns NVML off, for example).
Exits 2 for an unknown driver, 1 when discovery fails, 3 when a record does
not pass the hardware record schema (the JSON is printed either way).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

import orjson
from oslo_config import cfg

from acceld import config
from acceld.drivers import loader, record_schema


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acceld.drivers.show",
                                     description="Print a driver's discovery as JSON.")
    parser.add_argument("name", help="driver name (an entry point in acceld.drivers)")
    parser.add_argument("--config-file", action="append", default=[],
                        help="acceld config file (repeatable)")
    parser.add_argument("--host", help="node name used for uuids (default [DEFAULT] host)")
    args = parser.parse_args(argv)
    # Drivers say why they fell back (e.g. NVML unavailable) at INFO: show it on stderr.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    conf = config.load(conf=cfg.ConfigOpts(), config_files=args.config_file)
    try:
        driver = loader.load(args.name, conf, args.host or conf.host)
    except loader.UnknownDriver as exc:
        print(f"show: {exc}", file=sys.stderr)
        return 2
    try:
        records = [r.to_dict() for r in driver.discover()]
    except Exception as exc:  # noqa: BLE001 - report any driver failure plainly
        print(f"show: driver {args.name} failed to discover: {exc!r}", file=sys.stderr)
        return 1
    sys.stdout.write(orjson.dumps({"driver": args.name, "hardware": records},
                                  option=orjson.OPT_INDENT_2).decode() + "\n")
    problems = record_schema.check_node(records).problems
    for problem in problems:
        print(f"show: record {problem.index} is invalid: {problem.message}", file=sys.stderr)
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
