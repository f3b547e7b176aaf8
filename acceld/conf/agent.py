"""``[agent]``: the node agent's listener, drivers, intervals, and how it and its driver
processes do what needs root."""

from __future__ import annotations

from oslo_config import cfg

agent_group = cfg.OptGroup("agent", title="The node agent")

agent_opts = [
    cfg.HostAddressOpt("host_ip", default="127.0.0.1", help="Address the agent listens on."),
    cfg.PortOpt("port", default=6668, help="Port of the agent's internal API."),
    cfg.StrOpt("advertise_endpoint",
               help="host:port the conductor uses to reach this agent. Unset: host_ip:port."),
    cfg.ListOpt("enabled_drivers", default=["fake", "pci"],
                help="In-process drivers the agent loads (entry points in acceld.drivers)."),
    cfg.IntOpt("heartbeat_interval", default=10, min=1,
               help="Seconds between heartbeats to the conductor."),
    cfg.IntOpt("discovery_interval", default=60, min=1,
               help="Seconds between rescans of the hardware."),
    cfg.StrOpt("bitstream_dir",
               help="Directory of bitstream and firmware files named by image id, for clouds "
                    "without Glance."),
    # Read by acceld.privileged, which only the agent and driver processes load (the
    # API and the conductor register it without loading oslo.privsep).
    cfg.StrOpt("privileged_calls", default="privsep", choices=["privsep", "in_process"],
               help="How the agent and driver processes do what needs root (sysfs "
                    "writes for mediated devices, vendor programming tools): privsep "
                    "starts a daemon with only the capabilities each needs "
                    "([privsep_sysfs], [privsep_tools] helper_command; the agent itself "
                    "runs unprivileged); in_process does them in the calling process, "
                    "which must then have the privileges (an agent run as root, the "
                    "all-in-one, tests)."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(agent_opts, group=agent_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {agent_group: agent_opts}
