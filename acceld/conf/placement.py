"""``[placement]``: calls to Placement and the inventory mirror's sync and audit
(keystoneauth's options beside; acceld.conf._keystoneauth)."""

from __future__ import annotations

from oslo_config import cfg

from acceld.conf import _keystoneauth

placement_group = cfg.OptGroup("placement", title="Placement")

placement_opts = [
    cfg.FloatOpt("deadline", default=45.0, min=0.1,
                 help="Seconds one call to Placement may take in all (the token included; "
                      "[placement] timeout bounds each attempt's connect and read): a "
                      "Placement that never answers, or trickles its answer, is cut off "
                      "there and treated as unavailable."),
    cfg.BoolOpt("check_allocations", default=True,
                help="When binding, require the instance's Placement allocation to include "
                     "the device provider."),
    cfg.FloatOpt("sync_interval", default=2.0, min=0.05,
                 help="Seconds between passes that write changed (dirty) accelerator "
                      "providers to Placement."),
    cfg.FloatOpt("full_sync_interval", default=60.0, min=1,
                 help="Seconds between passes that compare every accelerator provider "
                      "with the database, catching changes nobody marked."),
    cfg.FloatOpt("retry_max_delay", default=60.0, min=0.1,
                 help="Longest wait, in seconds, between retries while Placement is "
                      "unreachable or a compute-node provider is missing (the wait "
                      "doubles from sync_interval up to this)."),
    cfg.FloatOpt("audit_interval", default=600.0, min=1,
                 help="Seconds between audits that read every host's accelerator providers "
                      "back from Placement and repair what differs from the database (a "
                      "provider deleted or edited by hand, a restored backup). One also "
                      "starts with the conductor; a walk longer than this starts the next "
                      "when it ends. Also the period of the standalone claims' audit (one "
                      "conductor at a time), which compares every claim consumer's "
                      "allocation with the database and removes what no claim holds (a "
                      "release through an API of the previous release, a writer that died "
                      "after a write Placement could not refuse)."),
    cfg.IntOpt("audit_hosts_per_pass", default=20, min=1,
               help="Most hosts one sync pass audits (every sync_interval), so that a "
                    "large cloud's audit is spread over passes instead of one long one. "
                    "A pass also stops auditing once it has spent sync_interval seconds "
                    "on it (at least one host a pass)."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(placement_opts, group=placement_group.name)
    _keystoneauth.register_opts(conf, placement_group)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {placement_group: placement_opts + _keystoneauth.list_opts(placement_group)}
