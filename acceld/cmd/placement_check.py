"""The Placement part of ``acceld-status upgrade check``: Placement answers, at the
microversion acceld pins (acceld.clients.placement.MICROVERSION)."""

from __future__ import annotations

from keystoneauth1 import exceptions as ks_exc
from oslo_config import cfg
from oslo_upgradecheck.upgradecheck import Code, Result

from acceld.clients import placement


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def check_placement(conf: cfg.ConfigOpts) -> Result:
    if not placement.is_configured(conf):
        return Result(Code.SUCCESS, "Placement is not configured ([placement] auth_type "
                                    "unset): acceld runs without it.")
    try:
        client = placement.from_conf(conf)
        assert client is not None
        resp = client.adapter.get("/", microversion=None, raise_exc=False)
    except ks_exc.ClientException as exc:
        return Result(Code.FAILURE, f"Placement cannot be reached: {exc}")
    if resp.status_code != 200:
        return Result(Code.FAILURE, f"Placement answered {resp.status_code} to its version "
                                    f"document: {resp.text[:300]}")
    try:
        versions = resp.json()["versions"]
        newest = max(_tuple(v["max_version"]) for v in versions)
    except (ValueError, KeyError, TypeError):
        return Result(Code.FAILURE, "Placement's version document is not what Placement "
                                    f"serves: {resp.text[:300]}")
    needed = _tuple(placement.MICROVERSION)
    shown = ".".join(map(str, newest))
    if newest < needed:
        return Result(Code.FAILURE, f"Placement serves microversions up to {shown}; acceld "
                                    f"needs {placement.MICROVERSION}: upgrade Placement first.")
    return Result(Code.SUCCESS, f"Placement serves up to {shown} (acceld needs "
                                f"{placement.MICROVERSION}).")
