"""``[nova]``: how the conductor sends Nova its events (keystoneauth's options beside;
acceld.conf._keystoneauth). endpoint_override reaches a Nova without a catalog (tests).
Each call's retries are keystoneauth's (connect_retries, status_code_retries and their
delays); acceld has no retry loop of its own on top."""

from __future__ import annotations

from oslo_config import cfg

from acceld.conf import _keystoneauth

nova_group = cfg.OptGroup("nova", title="Nova")

nova_opts = [
    cfg.FloatOpt("deadline", default=30.0, min=0.1,
                 help="Seconds one send of events to Nova may take in all: every attempt "
                      "([nova] timeout bounds each one's connect and read), keystoneauth's "
                      "retries and their delays, and the token. A Nova that never answers, "
                      "or trickles its answer, is cut off there and the events are sent "
                      "again later. Also bounded by the bind job's lease."),
    cfg.FloatOpt("retry_initial_delay", default=0.5, min=0,
                 help="When Nova stays unavailable through [nova] connect_retries and "
                      "status_code_retries, the bind job sends its event again later: first "
                      "after this many seconds (at least 1), doubling per attempt up to "
                      "[conductor] bind_lease_seconds."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(nova_opts, group=nova_group.name)
    _keystoneauth.register_opts(conf, nova_group)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {nova_group: nova_opts + _keystoneauth.list_opts(nova_group)}
