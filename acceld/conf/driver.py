"""``[driver]``: an external driver process (``acceld driver NAME``) and the agent it
registers with."""

from __future__ import annotations

from oslo_config import cfg

driver_group = cfg.OptGroup("driver", title="External driver processes")

driver_opts = [
    cfg.HostAddressOpt("host_ip", default="127.0.0.1",
                       help="Address an external driver process (`acceld driver NAME`) "
                            "listens on."),
    cfg.PortOpt("port", default=0,
                help="Port of an external driver process; 0 picks a free one."),
    cfg.StrOpt("agent_url",
               help="URL an external driver process registers with. Unset: "
                    "http://<[agent] host_ip>:<[agent] port>."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(driver_opts, group=driver_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {driver_group: driver_opts}
