"""``acceld-status upgrade check`` (oslo.upgradecheck), run on a controller before and
after an upgrade, as ``nova-status`` and ``cyborg-status`` are.

Checks: the database schema is at this code's head (a warning while contract migrations
are left, or while it is ahead of this code by a newer release's expand migrations); the
policy file parses, refers to no undefined rule and uses no deprecated rule; Placement
answers at the microversion acceld pins; every agent that is up speaks an internal API
this installation serves (a warning naming those of the previous release: the rolling-
upgrade window); every Bound ARQ holds its attach handle (acceld.cmd.arqs_check).
Exit status as oslo.upgradecheck defines it: 0 success,
1 warning, 2 failure, 255 the check itself failed.
"""

from __future__ import annotations

import sys
from typing import Any

from oslo_config import cfg
from oslo_upgradecheck import common_checks, upgradecheck

import acceld.conf

Result = upgradecheck.Result
Code = upgradecheck.Code



def _database() -> Any:
    from acceld.db.engine import from_config

    return from_config(cfg.CONF)


def _unreachable(exc: BaseException) -> Result:
    return Result(Code.FAILURE, f"The database cannot be reached: {exc}")


class Checks(upgradecheck.UpgradeCommands):
    """The checks; each returns a Result and never raises for what it checks."""

    def _check_schema(self) -> Result:
        from sqlalchemy.exc import DBAPIError

        from acceld.db import migrate

        db = _database()
        try:
            newer = migrate.check_current(db)
            left = [] if newer else migrate.pending(db)
        except migrate.SchemaNotCurrent as exc:
            return Result(Code.FAILURE, str(exc))
        except DBAPIError as exc:
            return _unreachable(exc.orig or exc)
        finally:
            db.dispose()
        if newer:  # this installation is the older one: the window, seen from N-1
            return Result(Code.WARNING, migrate.ahead_warning(newer))
        if left:  # only contract migrations (check_current refuses anything else)
            return Result(Code.WARNING, (
                f"Expanded; contract migration(s) left: "
                f"{', '.join(m.revision for m in left)}. Run `acceld db upgrade "
                "--contract` once every service (agents and driver processes included) "
                "runs this release."))
        return Result(Code.SUCCESS, f"At revision {migrate.head_revision()}.")

    def _check_policy(self) -> Result:
        from acceld.cmd.policy_check import check_policy

        json_result = common_checks.check_policy_json(self, cfg.CONF)
        result = check_policy(cfg.CONF)
        return result if result.code >= json_result.code else json_result

    def _check_placement(self) -> Result:
        from acceld.cmd.placement_check import check_placement

        return check_placement(cfg.CONF)

    def _check_agents(self) -> Result:
        from acceld.cmd.agents_check import check_agents

        return check_agents(cfg.CONF)

    def _check_bound_arqs(self) -> Result:
        from acceld.cmd.arqs_check import check_arqs

        return check_arqs(cfg.CONF)

    _upgrade_checks = (
        ("Database schema", _check_schema),
        ("Policy file", _check_policy),
        ("Placement API", _check_placement),
        ("Agent versions", _check_agents),
        ("Bound accelerator requests", _check_bound_arqs),
    )


def main(argv: list[str] | None = None) -> int:
    conf = cfg.CONF
    acceld.conf.register_opts(conf)
    files = list(dict.fromkeys(cfg.find_config_files(project="acceld", prog="acceld")))
    return upgradecheck.main(conf, project="acceld", upgrade_command=Checks(),
                             argv=sys.argv[1:] if argv is None else argv,
                             default_config_files=files)


if __name__ == "__main__":
    sys.exit(main())
