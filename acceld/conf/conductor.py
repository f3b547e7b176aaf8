"""``[conductor]``: how the conductors are reached, share the hosts, bind, program and
watch the agents."""

from __future__ import annotations

from oslo_config import cfg

conductor_group = cfg.OptGroup("conductor", title="The conductor")

conductor_opts = [
    cfg.HostAddressOpt("host_ip", default="127.0.0.1", help="Address the conductor listens on."),
    cfg.PortOpt("port", default=6667, help="Port of the conductor's internal API."),
    cfg.ListOpt("url", help="URL(s) agents and API workers use to reach the conductors: "
                            "one (a single conductor, or one name behind a load balancer) "
                            "or a comma-separated list; a client spreads over the list, "
                            "fails over to the next when one does not answer and returns "
                            "to its preferred one after failback_interval. "
                            "Unset: http://<host_ip>:<port>."),
    cfg.FloatOpt("connect_timeout", default=3.0, min=0.1,
                 help="Seconds a client of the conductor waits for a connection before it "
                      "tries the next URL of [conductor] url."),
    cfg.FloatOpt("failback_interval", default=60.0, min=1.0,
                 help="Seconds after failing over before a client of the conductor tries "
                      "its preferred URL again."),
    cfg.FloatOpt("hardware_pull_timeout", default=20.0, min=1.0,
                 help="Seconds the conductor's GET /hardware of an agent (inside the "
                      "agent's hello) may take in all, however slowly the agent answers; "
                      "keep it under the 30 s an agent waits for a hello that pulls."),
    cfg.IntOpt("max_hardware_report", default=4 * 1024 * 1024, min=64 * 1024,
               help="Bytes an agent's GET /hardware answer may have (read as it arrives; "
                    "the pull fails beyond, with nothing more read)."),
    cfg.IntOpt("hardware_pulls", default=8, min=1,
               help="Pulls of agents' hardware one conductor runs at once (at most half "
                    "of [internal] server_threads); a hello that finds them all running "
                    "is answered without a pull and the agent's next hello pulls."),
    cfg.ListOpt("agent_networks", default=[],
                help="Networks (CIDR) an agent's endpoint may be in when it is not the "
                     "address its hello came from (conductors behind a load balancer or "
                     "NAT). Empty: an endpoint must be at the hello's source address (a "
                     "loopback endpoint only for a hello over loopback)."),
    cfg.StrOpt("name",
               help="This conductor's name in the hash ring that divides per-host work "
                    "among the conductors sharing the database; unique per conductor and "
                    "stable across restarts (a restarted conductor gets its hosts back). "
                    "Unset: <hostname>:<port>."),
    cfg.FloatOpt("member_heartbeat_interval", default=2.0, min=0.05,
                 help="Seconds between a conductor's heartbeats in the conductors table; "
                      "each also re-reads the live conductors and rebalances the ring."),
    cfg.FloatOpt("member_dead_after", default=10.0, min=0.1,
                 help="A conductor silent this long (by the database's clock, at least two "
                      "heartbeats) is dropped from the ring and its hosts' periodic work "
                      "moves to the others within this plus one heartbeat."),
    cfg.FloatOpt("bind_poll_interval", default=1.0, min=0.01,
                 help="Seconds between scans for pending bind jobs (a safety net; the API "
                      "also wakes the conductor directly)."),
    cfg.IntOpt("bind_workers", default=4, min=1, help="Threads that complete bind jobs."),
    cfg.IntOpt("bind_lease_seconds", default=60, min=5,
               help="A bind job claimed by a conductor that died is retried after this."),
    cfg.IntOpt("bind_timeout", default=240, min=10, deprecated_group="DEFAULT",
               help="Seconds after a bind was asked for during which an outage (Placement, "
                    "the node's agent, the image service, the database unavailable) is "
                    "waited out with capped backoff; then the bind ends BindFailed naming "
                    "what was unavailable. Keep it below Nova's [DEFAULT] "
                    "arq_binding_timeout (300 s by default), so that Nova hears the "
                    "outcome before it gives up."),
    cfg.FloatOpt("bind_delay_for_tests", default=0.0, min=0.0,
                 help="Testing only: seconds each bind waits before its transaction, so that "
                      "a crash test can kill the conductor in the middle of a batch. Leave 0."),
    cfg.IntOpt("agent_down_intervals", default=3, min=2,
               help="An agent silent for this many heartbeat intervals is marked down."),
    cfg.FloatOpt("heartbeat_flush_interval", default=1.0, min=0.0,
                 help="Seconds between the conductor's coalesced writes of its agents' "
                      "last contact: a heartbeat that changes nothing is answered from "
                      "memory and stamped in one UPDATE per interval for every host heard "
                      "(acceld.conductor.fleet.liveness). 0: one transaction per heartbeat."),
    cfg.FloatOpt("agent_check_interval", default=2.0, min=0.05,
                 help="Seconds between liveness sweeps: each conductor marks down the "
                      "silent agents among the hosts it owns."),
    cfg.BoolOpt("reserve_devices_of_down_agents", default=True,
                help="Reserve the Placement inventory of a down agent's devices."),
    cfg.IntOpt("program_timeout", default=100, min=1,
               help="Seconds one program (bitstream or firmware: download and write) may "
                    "take in the agent; a second program of the same deployable waits as "
                    "long again for the first. The API waits for the result (up to twice "
                    "this plus 15 s) and its workers' timeout follows."),
    cfg.IntOpt("program_workers", default=4, min=1,
               help="Threads that run asynchronous programs (microversion 2.5, 202); "
                    "further requests queue, shown PROGRAMMING, until a thread is free."),
    cfg.IntOpt("attach_timeout", default=30, min=1,
               help="Seconds the conductor waits for an agent to prepare an attach handle "
                    "on bind (create a vGPU mdev, ...) or to release it after unbind."),
    cfg.StrOpt("health_recovery", default="auto", choices=("auto", "manual"),
               help="How a device quarantined for its health returns to service: 'auto' "
                    "after health_recovery_reports healthy reports in a row; 'manual' only "
                    "when an operator returns it (PATCH /v2/devices/{uuid} at microversion "
                    "2.6). docs/devices.md, Health."),
    cfg.IntOpt("health_recovery_reports", default=3, min=1,
               help="Consecutive healthy reports (one per discovery of the node's agent) "
                    "after which a quarantined device returns to service; any report that "
                    "is not healthy starts the count again."),
    cfg.IntOpt("device_event_retention", default=30 * 86400, min=60,
               help="Seconds a device event (health changes, operator enable/disable, "
                    "programs, vanish/return) is kept; older ones are purged by a periodic "
                    "task of one conductor."),
    cfg.FloatOpt("device_event_purge_interval", default=3600.0, min=1.0,
                 help="Seconds between purges of device events older than "
                      "device_event_retention."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(conductor_opts, group=conductor_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {conductor_group: conductor_opts}
