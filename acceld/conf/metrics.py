"""``[metrics]``: Prometheus metrics (acceld.metrics; docs/observability.md): each service
serves /metrics on an address of its own, never on the public API's port."""

from __future__ import annotations

from oslo_config import cfg

metrics_group = cfg.OptGroup("metrics", title="Prometheus metrics")

metrics_opts = [
    cfg.BoolOpt("api_enabled", default=False,
                help="Serve the API's metrics (requests by route, the inventory read from "
                     "the database) on api_host_ip:api_port. Served by the gunicorn master "
                     "from every worker's counters; Prometheus needs no Keystone token, so "
                     "keep the address on a management network."),
    cfg.HostAddressOpt("api_host_ip", default="127.0.0.1",
                       help="Address of the API's metrics listener."),
    cfg.PortOpt("api_port", default=9466, help="Port of the API's metrics listener."),
    cfg.BoolOpt("conductor_enabled", default=False,
                help="Serve the conductor's metrics (binds, Nova events, Placement, "
                     "reconciles, heartbeats, programs) on conductor_host_ip:conductor_port."),
    cfg.HostAddressOpt("conductor_host_ip", default="127.0.0.1",
                       help="Address of the conductor's metrics listener."),
    cfg.PortOpt("conductor_port", default=9467, help="Port of the conductor's metrics listener."),
    cfg.BoolOpt("agent_enabled", default=False,
                help="Serve the agent's metrics (discovery per driver) on "
                     "agent_host_ip:agent_port."),
    cfg.HostAddressOpt("agent_host_ip", default="127.0.0.1",
                       help="Address of the agent's metrics listener."),
    cfg.PortOpt("agent_port", default=9468, help="Port of the agent's metrics listener."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(metrics_opts, group=metrics_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {metrics_group: metrics_opts}
