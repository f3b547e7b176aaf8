"""Every acceld option, in one place.

Defaults describe the all-in-one: SQLite under the state path, no Keystone,
every service on 127.0.0.1. A config file (``--config-file``) overrides them,
and any option can also come from the environment as ``OS_<GROUP>__<OPTION>``
(oslo.config's environment source), e.g. ``OS_DATABASE__CONNECTION``.
"""

from __future__ import annotations

import copy
import os
import socket
from typing import Sequence

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

CONF = cfg.CONF

default_opts = [
    cfg.StrOpt("host", default=socket.gethostname(), sample_default="<hostname>",
               help="Name of this node. The agent reports its hardware under this name "
                    "and the conductor finds the compute-node provider in Placement by it, "
                    "so it must match Nova's hypervisor hostname."),
    cfg.StrOpt("state_path", default="./.acceld",
               help="Directory for local state: the SQLite database and generated secrets."),
    cfg.StrOpt("auth_strategy", default="noauth", choices=["noauth", "keystone"],
               help="noauth trusts identity headers (X-User-Id, X-Project-Id, X-Roles, "
                    "X-Service-Roles); keystone validates tokens with keystonemiddleware."),
]
# Logging options (debug, log_file, log_config_append, use_journal, use_json, ...) are
# oslo.log's own, registered by acceld.logs.register_options.

api_opts = [
    cfg.HostAddressOpt("host_ip", default="127.0.0.1", help="Address the public API listens on."),
    cfg.PortOpt("port", default=6666, help="Port the public API listens on."),
    cfg.IntOpt("workers", default=2, min=1, deprecated_name="api_workers",
               help="Number of API worker processes (gunicorn workers, each serving with "
                    "[api] threads threads; acceld.services.api_worker)."),
    cfg.IntOpt("threads", default=4, min=1,
               help="Threads per API worker. One at a time runs the application (the "
                    "serving slot: threads sharing one GIL and serving together cost more "
                    "CPU per request than one alone); a thread that waits for the "
                    "conductor, Placement, Keystone, a database lock or a client reading a "
                    "large answer leaves the slot and the next takes over, so this many "
                    "such waits can run at once: give more than one worker may wait on at "
                    "once (docs/security.md, \"Slow clients\"). Idle and "
                    "kept-alive connections, and requests whose head or body is still "
                    "arriving, wait in the worker's epoll, not in a thread."),
    cfg.FloatOpt("client_header_timeout", default=10.0, min=0.1,
                 help="Seconds a client has, from connecting (or from its next request's "
                      "first byte on a kept-alive connection), to send the complete request "
                      "line and headers; a slower client is disconnected."),
    cfg.FloatOpt("client_body_timeout", default=30.0, min=0.1,
                 help="Seconds a client has, once its headers are in, to send the whole "
                      "request body; a slower client gets 408 and is disconnected."),
    cfg.StrOpt("public_endpoint",
               help="Base URL used in links, e.g. https://cloud.example.com:6666. "
                    "Unset: taken from the request."),
    cfg.IntOpt("max_request_body_size", default=1024 * 1024, min=1024,
               help="Largest request body accepted, in bytes; larger bodies get 413."),
    cfg.FloatOpt("bind_wait", default=0.5, min=0.0, max=10.0,
                 help="Seconds a bind PATCH waits, after committing its binds, for the "
                      "conductor to resolve them (Bound or BindFailed) before it answers "
                      "202, so that the client's next GET finds them resolved, as with "
                      "upstream. A bind not resolved by then (a device being programmed, "
                      "a busy conductor) completes after the answer, as always. 0 answers "
                      "at once."),
    cfg.FloatOpt("database_lock_timeout", default=10.0, min=0.0,
                 help="Seconds one statement of an API request waits for a lock another "
                      "transaction holds on PostgreSQL (lock_timeout) or MariaDB/MySQL "
                      "(innodb_lock_wait_timeout and lock_wait_timeout, whole seconds): "
                      "a migration run under live services, a long transaction elsewhere. "
                      "Then the request is rolled back and answered 503 with Retry-After. "
                      "The worker serves other requests meanwhile either way. 0: the "
                      "database server's own settings. SQLite's write lock is bounded by "
                      "[database] sqlite_busy_timeout."),
    cfg.IntOpt("max_patch_operations", default=1000, min=1,
               help="Most ARQs one PATCH may bind or unbind; more get 400."),
    cfg.IntOpt("max_arqs_per_delete", default=1000, min=1,
               help="Most ARQ uuids one DELETE ?arqs= list may name; more get 400."),
    cfg.IntOpt("max_arqs_per_create", default=1000, min=1,
               help="Most ARQs one POST /accelerator_requests may create (the sum of the "
                    "profile's resources:* amounts); a larger profile gets 400."),
    cfg.IntOpt("max_limit", default=1000, min=1,
               help="Largest page of a paginated list (ARQs from microversion 2.5): a "
                    "larger ?limit= is lowered to this, and a list without ?limit= "
                    "returns pages of this size, as Nova and Ironic do."),
    cfg.StrOpt("tls_cert_file",
               help="PEM certificate (chain) for the public API: set with tls_key_file to "
                    "serve HTTPS directly from gunicorn."),
    cfg.StrOpt("tls_key_file", help="PEM private key for the public API's certificate."),
    cfg.BoolOpt("allow_insecure_noauth", default=False,
                help="Let auth_strategy = noauth listen on an address other than loopback, "
                     "and run at all under a WSGI server of your own "
                     "(acceld.wsgi.api:application, whose listen address acceld cannot "
                     "see). noauth makes anyone who reaches the port an admin: leave this "
                     "off unless something else (a proxy that authenticates) guards the "
                     "port."),
    cfg.StrOpt("noauth_user_id", default="admin",
               help="noauth: user id when a request carries no X-User-Id."),
    cfg.StrOpt("noauth_project_id", default="admin",
               help="noauth: project id when a request carries no X-Project-Id."),
    cfg.ListOpt("noauth_roles", default=["admin", "member", "reader", "manager"],
                help="noauth: roles when a request carries no X-Roles."),
    cfg.ListOpt("noauth_service_roles", default=["service"],
                help="noauth: service roles when a request carries none of the identity "
                     "headers, so that the CLI and SDK can bind without Keystone."),
    cfg.BoolOpt("require_service_token_for_bind", default=True,
                help="Require the service role (a service token) for bind, unbind, delete "
                     "by instance and delete of a bound ARQ, as upstream does."),
    cfg.StrOpt("service_role", default="service",
               help="Role a service token must carry for the operations above."),
    cfg.StrOpt("service_token_project", default="service",
               help="Project a service token's user must be scoped to for the operations "
                    "above (its id, or its name in [api] service_token_project_domain): "
                    "Nova's service user is in the cloud's service project. A service "
                    "token never counts when it belongs to the same user as the token it "
                    "comes with. Empty: any project (the role alone)."),
    cfg.StrOpt("service_token_project_domain", default="Default",
               help="Domain (name or id) in which [api] service_token_project is a "
                    "project's name: names are unique only within a domain."),
]

database_opts = [
    cfg.StrOpt("connection", secret=True,
               help="SQLAlchemy URL. Unset: sqlite:///<state_path>/acceld.sqlite. "
                    "PostgreSQL: postgresql+psycopg://user:pw@host/acceld; "
                    "MariaDB/MySQL: mysql+pymysql://user:pw@host/acceld."),
    cfg.IntOpt("sqlite_busy_timeout", default=30000, min=0,
               help="Milliseconds a SQLite writer waits for the write lock."),
    cfg.IntOpt("pool_size", default=5, min=1, deprecated_name="max_pool_size",
               help="Connections kept per process (server databases)."),
    cfg.IntOpt("max_overflow", default=10, min=0, help="Extra connections allowed beyond pool_size."),
    cfg.BoolOpt("echo", default=False, help="Log every SQL statement (debugging)."),
]

internal_opts = [
    cfg.StrOpt("shared_secret", secret=True,
               help="The cloud's internal secret (at least 32 characters), held by "
                    "controllers (conductor, API): API -> conductor calls are signed with "
                    "it, and every node's key is derived from it. Unset: read from "
                    "<state_path>/internal.secret, created with mode 0600."),
    cfg.StrOpt("node_key", secret=True,
               help="This node's own key (agent, driver processes), printed on a controller "
                    "by `acceld internal node-key <host>` (or `acceld node-key rotate "
                    "<host>`) for [DEFAULT] host; a key rotated to generation N reads "
                    "g<N>:<hex>. A node given only its key can speak for no other node. "
                    "Unset: node_key_file, else derived from the cloud's secret where this "
                    "machine has it (generation 0)."),
    cfg.StrOpt("node_key_file",
               help="File holding this node's key (mode 0600), instead of node_key."),
    cfg.IntOpt("credential_ttl", default=60, min=5,
               help="Seconds an internal credential stays valid; a used one cannot be replayed."),
    cfg.IntOpt("max_request_body", default=1024 * 1024, min=4096,
               help="Largest internal request body, in bytes (413 beyond). Internal requests "
                    "are small (hellos, program and attach calls); hardware reports travel "
                    "in answers, which this does not limit."),
    cfg.IntOpt("server_threads", default=16, min=1,
               help="Threads of each internal server; each serves the requests it reads, "
                    "and requests beyond wait for one. Idle connections hold no thread."),
    cfg.IntOpt("max_connections", default=256, min=2,
               help="Open connections an internal server keeps; at the limit the "
                    "longest-waiting idle one is closed for a new one (when every one "
                    "holds a request, the new one is closed and its client retries)."),
    cfg.FloatOpt("header_timeout", default=10.0, min=0.1,
                 help="Seconds a client of an internal server has, from connecting, to send "
                      "its request line and headers; then it is disconnected."),
    cfg.FloatOpt("request_timeout", default=60.0, min=1.0,
                 help="Seconds an internal server gives a client to send its body, and to "
                      "take each write of the answer."),
    cfg.FloatOpt("idle_timeout", default=60.0, min=0.1,
                 help="Seconds an internal server keeps an HTTP/1.1 connection open, idle, "
                      "for the client's next request (agents heartbeat over one "
                      "connection). Idle connections hold no thread and are the first "
                      "closed at max_connections."),
    cfg.StrOpt("tls_cert_file", help="PEM certificate for internal servers (enables TLS)."),
    cfg.StrOpt("tls_key_file", help="PEM private key for internal servers."),
    cfg.StrOpt("tls_ca_file", help="CA bundle internal clients use to verify internal servers."),
]

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
]

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

fake_driver_opts = [
    cfg.ListOpt("devices", default=["FPGA"],
                help="Simulated devices, one entry per device, by type: FPGA, GPU, QAT, "
                     "AICHIP, NIC, SSD. The default is what upstream's fake driver reports: "
                     "one FPGA named FakeDevice."),
    cfg.IntOpt("attach_handles", default=16, min=1, max=256,
               help="Attach handles (and accelerators) per simulated device."),
    cfg.StrOpt("spec_file",
               help="JSON file describing the simulated devices, read again at every "
                    "discovery (so a running demo or test can change its hardware). "
                    "Overrides `devices`; see docs/drivers.md for its format."),
    cfg.StrOpt("state_dir",
               help="Where programming is recorded (one JSON file per deployable). "
                    "Unset: <state_path>/fake_driver."),
    cfg.StrOpt("attach_type", default="TEST_PCI", choices=["TEST_PCI", "MDEV"],
               help="Attach handles of the simulated devices. MDEV simulates vGPU-style "
                    "handles that must be prepared on bind and released after unbind "
                    "(recorded under state_dir); the default is upstream's TEST_PCI."),
]

pci_driver_opts = [
    cfg.StrOpt("sysfs_root", default="/sys",
               help="Root of the sysfs tree scanned (devices under bus/pci/devices)."),
    cfg.MultiStrOpt("device_spec",
                    deprecated_opts=[cfg.DeprecatedOpt("passthrough_whitelist", group="pci")],
                    default=['[{"vendor_id": "10de"}, {"vendor_id": "1002"}, '
                             '{"vendor_id": "8086"}, {"vendor_id": "10ee"}, '
                             '{"vendor_id": "1172"}, {"vendor_id": "19e5"}, '
                             '{"vendor_id": "1da3"}]'],
                    help="Nova-style allow-list (repeatable; each value a JSON object or a "
                         "list of objects) with vendor_id, product_id, address (glob string "
                         "or regex object) and the tags resource_class and traits. A PCI "
                         "function is reported when any entry matches and its class is in "
                         "device_classes."),
    cfg.ListOpt("device_classes", default=["0x0300", "0x0302", "0x0380", "0x1200", "0x0b40"],
                help="PCI classes (base and sub class, 0xBBSS) the driver reports; the class "
                     "decides the device type: 03xx GPU, 1200 FPGA or AICHIP, 0b40 QAT, "
                     "0108 SSD, 0200 NIC. Others cannot be reported."),
    cfg.StrOpt("rc", default="CUSTOM_PCI",
               help="Resource class of PCI deployables when the matching allow-list entry "
                    "names none."),
]

# [nova], [placement] and [glance] also get keystoneauth's standard options (auth_type,
# endpoint_override, ...): endpoint_override reaches a service without a catalog (tests).
# Each call's retries are keystoneauth's (connect_retries, status_code_retries and their
# delays, per group); acceld has no retry loop of its own on top (KEYSTONEAUTH_RETRIES).
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
                      "when it ends."),
    cfg.IntOpt("audit_hosts_per_pass", default=20, min=1,
               help="Most hosts one sync pass audits (every sync_interval), so that a "
                    "large cloud's audit is spread over passes instead of one long one. "
                    "A pass also stops auditing once it has spent sync_interval seconds "
                    "on it (at least one host a pass)."),
]

glance_opts: list[cfg.Opt] = []

# How many ARQs a project may hold (acceld.api.arq_limits).
quota_opts = [
    cfg.StrOpt("driver", default="local", choices=["local", "unified_limits"],
               help="Where a project's ARQ limit comes from: local uses arqs_per_project "
                    "below; unified_limits asks Keystone (oslo.limit, resource "
                    "accelerator_requests, configured in [oslo_limit])."),
    cfg.IntOpt("arqs_per_project", default=10000, min=-1,
               help="local: most ARQs one project may hold; a create that would go beyond "
                    "gets 403 naming the limit. -1: unlimited. The default is far above "
                    "any real project's accelerators yet bounds the rows (and the "
                    "unpaginated list before 2.5) one project can make."),
]

# Prometheus metrics (acceld.metrics; docs/observability.md): each service serves /metrics
# on an address of its own, never on the public API's port.
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

# [agent] privileged_calls: defined here, not in acceld.privileged, so that registering it
# loads no oslo.privsep in the services that never call it (the API, the conductor).
privileged_opts = [
    cfg.StrOpt("privileged_calls", default="privsep", choices=["privsep", "in_process"],
               help="How the agent and driver processes do what needs root (sysfs "
                    "writes for mediated devices, vendor programming tools): privsep "
                    "starts a daemon with only the capabilities each needs "
                    "([privsep_sysfs], [privsep_tools] helper_command; the agent itself "
                    "runs unprivileged); in_process does them in the calling process, "
                    "which must then have the privileges (an agent run as root, the "
                    "all-in-one, tests)."),
]

GROUPS: dict[str | None, list[cfg.Opt]] = {
    None: default_opts,
    "api": api_opts,
    "database": database_opts,
    "internal": internal_opts,
    "conductor": conductor_opts,
    "agent": agent_opts,
    "driver": driver_opts,
    "fake_driver": fake_driver_opts,
    "pci_driver": pci_driver_opts,
    "nova": nova_opts,
    "placement": placement_opts,
    "glance": glance_opts,
    "quota": quota_opts,
    "metrics": metrics_opts,
}

# In-tree hardware drivers (acceld/drivers/<group>.py): one group per driver.


def _sysfs_root_opt() -> cfg.StrOpt:
    return cfg.StrOpt("sysfs_root", default="/sys",
                      help="Where sysfs is mounted; tests point it at a fixture tree.")


def _resource_class_opt(default: str) -> cfg.StrOpt:
    return cfg.StrOpt("resource_class", default=default, regex=r"^(CUSTOM_)?[A-Z0-9_]+$",
                      help="Placement resource class of this driver's deployables.")


def _tool_timeout_opt() -> cfg.IntOpt:
    return cfg.IntOpt("program_timeout", default=90, min=1,
                      help="Seconds a programming tool may run before it is stopped and "
                           "the program request fails. Keep it below [conductor] "
                           "program_timeout, which bounds the whole request.")


GROUPS.update({
    "nvidia_gpu": [
        _sysfs_root_opt(),
        cfg.BoolOpt("use_nvml", default=True,
                    help="Use NVML (nvidia-ml-py) when it imports and initialises; "
                         "otherwise, or when false, read sysfs only."),
        cfg.ListOpt("enabled_vgpu_types", default=[],
                    help="vGPU types to offer, by mdev type id (nvidia-223) or type name "
                         "(GRID T4-2B, NVIDIA H200X-1-18C). A GPU offering one of them is "
                         "not offered whole (PGPU)."),
        cfg.Opt("vgpu_max_instances", default={},
                type=cfg.types.Dict(value_type=cfg.types.Integer(min=0)),
                help="Most vGPUs of a type one GPU holds, by type name or id "
                     "(NVIDIA H200X-1-18C:7), used when NVML does not answer (as Nova's "
                     "[mdev_<type>] max_instances). NVML's maximum wins where NVML "
                     "answers. Without either, vGPUs on SR-IOV VFs are not offered."),
        cfg.ListOpt("ignored_xids", default=[13, 31, 43, 45, 68, 109],
                    item_type=cfg.types.Integer(min=0),
                    help="XID events that do not make a GPU unhealthy: the application "
                         "errors NVIDIA's Kubernetes device plugin ignores. Every other "
                         "critical XID does, until the agent restarts."),
        cfg.StrOpt("proc_root", default="/proc",
                   help="Where procfs is mounted: the MIG capability files "
                        "(driver/nvidia/capabilities/gpu<N>/mig/gi<id>) tell which GPU "
                        "instances exist when NVML refuses the unprivileged agent and the "
                        "privsep daemon cannot read them either."),
    ],
    "intel_fpga": [
        _sysfs_root_opt(),
        cfg.StrOpt("fpgaconf_path", default="/usr/bin/fpgaconf",
                   help="OPAE's fpgaconf, used to program bitstreams."),
        _tool_timeout_opt(),
    ],
    "xilinx_fpga": [
        _sysfs_root_opt(),
        cfg.StrOpt("xbmgmt_path", default="/opt/xilinx/xrt/bin/xbmgmt",
                   help="XRT's xbmgmt, used to program the shell and the base firmware."),
        _tool_timeout_opt(),
    ],
    "intel_qat": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_QAT"),
    ],
    "nvme": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_SSD"),
        cfg.StrOpt("mounts_path", default="/proc/self/mountinfo",
                   help="The mount table, in mountinfo form (mounts matched by major:minor, "
                        "so /dev/root counts) or /proc/mounts form (by source name only); a "
                        "controller with a mounted namespace is never offered. An agent in a "
                        "container reads the host's: /proc/1/mountinfo with the host's PID "
                        "namespace."),
        cfg.ListOpt("addresses", default=[],
                    help="PCI addresses of the controllers to offer (only these, and only "
                         "while the host does not use them). Empty: none is offered."),
        cfg.StrOpt("swaps_path", default="/proc/swaps",
                   help="The swap table; a controller with an active swap namespace or "
                        "partition is never offered."),
        cfg.StrOpt("udev_data_dir", default="/run/udev/data",
                   help="udev's database (b<major>:<minor> files): a namespace or partition "
                        "whose ID_FS_TYPE is a member signature (zfs_member, LVM2_member, "
                        "linux_raid_member, ...) is in use."),
        cfg.StrOpt("nvme_cli_path", default="nvme",
                   help="nvme-cli, used for the SMART critical warning (health). Absent: "
                        "health from PCIe only."),
        cfg.IntOpt("smart_timeout", default=10, min=1,
                   help="Seconds one 'nvme smart-log' may run."),
    ],
    "nic": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_NIC"),
        cfg.ListOpt("physical_device_mappings", default=[], deprecated_group="x710_static",
                    help="physnet:PF pairs, e.g. physnet2:enp94s0f0 or "
                         "physnet2:0000:5e:00.0 (a netdev name or a PCI address). Only "
                         "these PFs are reported; their VFs carry CUSTOM_PHYSNET_<NAME> "
                         "and upstream's CUSTOM_<NAME>, and their attach handles the "
                         "physical_network."),
        cfg.ListOpt("function_device_mappings", default=[], deprecated_group="x710_static",
                    help="function:PF pairs as upstream's [x710_static] "
                         "function_device_mappings (e.g. GTPv1:enp94s0f0): the PF's VFs "
                         "carry the trait CUSTOM_<FUNCTION>."),
    ],
    "ascend": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_ASCEND"),
        cfg.StrOpt("version_info_path", default="/usr/local/Ascend/driver/version.info",
                   help="The Ascend driver's version.info (Version=...)."),
    ],
})

# Services reached through keystoneauth: the standard session, auth and adapter options.
KEYSTONEAUTH_GROUPS = ("nova", "placement", "glance")
# acceld's defaults for keystoneauth's retry options where keystoneauth's (none) do not
# fit: Nova's events (also on a 502/504 from a proxy in front of it) and the agent's image
# downloads are retried a few times (delays 0.5, 1, 2 s); Placement keeps none, as its callers wait out an outage themselves (the
# sync's backoff, a bind's deadline) instead of holding a worker in a call.
# keystoneauth's ``timeout`` (each attempt's connect and read; its default, None, waits
# forever) gets a value in every group; the whole call's deadline is acceld's [nova] and
# [placement] deadline, and [conductor] program_timeout for Glance (acceld.clients.deadline).
KEYSTONEAUTH_RETRIES = {"nova": {"connect_retries": 3, "status_code_retries": 3,
                                  "retriable_status_codes": [502, 503, 504], "timeout": 10},
                        "placement": {"timeout": 30},
                        "glance": {"connect_retries": 3, "status_code_retries": 3,
                                   "timeout": 30}}


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register every option group on ``conf`` (idempotent)."""
    from acceld import logs

    logs.register_options(conf)
    for group, opts in GROUPS.items():
        conf.register_opts(opts, group=group)
    for group in KEYSTONEAUTH_GROUPS:
        ks_loading.register_session_conf_options(conf, group)
        ks_loading.register_auth_conf_options(conf, group)
        ks_loading.register_adapter_conf_options(conf, group)
        for name, value in KEYSTONEAUTH_RETRIES.get(group, {}).items():
            conf.set_default(name, value, group=group)
    _register_policy_opts(conf)
    _register_limit_opts(conf)
    conf.register_opts(privileged_opts, group="agent")
    set_lib_defaults()
    from acceld.api import edge  # [healthcheck], [oslo_middleware], [cors]

    edge.register_opts(conf)


# Seconds acceld waits for one answer of Keystone by default: [oslo_limit] timeout, and
# [keystone_authtoken] http_connect_timeout (acceld.api.auth).
KEYSTONE_TIMEOUT = 10


def _register_limit_opts(conf: cfg.ConfigOpts) -> None:
    """``[oslo_limit]``: how to reach Keystone's unified limits ([quota] driver =
    unified_limits). oslo.limit reads them from oslo.config's global CONF, which is the
    configuration every acceld service loads."""
    from oslo_limit import opts as limit_opts

    limit_opts.register_opts(conf)
    # keystoneauth waits for ever by default: a Keystone that accepts and never answers
    # would hold the create's thread (outside the serving slot) without end.
    limit_opts.CONF.set_default("timeout", KEYSTONE_TIMEOUT, group="oslo_limit")


def _register_policy_opts(conf: cfg.ConfigOpts) -> None:
    from oslo_policy import opts as policy_opts

    # Only the persona defaults apply unless an operator opts back into upstream's
    # transition mode (new default OR deprecated rule) with enforce_new_defaults = False.
    # (oslo.policy 4.5 made scope enforcement permanent and 6.0 removed enforce_scope.)
    policy_opts.set_defaults(conf, policy_file="policy.yaml", enforce_new_defaults=True)


def list_opts() -> list[tuple[str | None, list[cfg.Opt]]]:
    """Options per group, for the sample config."""
    from acceld import logs

    log_opts = [opt for _group, opts in logs.list_opts() for opt in opts]
    out: list[tuple[str | None, list[cfg.Opt]]] = [("DEFAULT", default_opts + log_opts)]
    out += [(g, o) for g, o in GROUPS.items() if g is not None and o]
    for group in KEYSTONEAUTH_GROUPS:
        ks_opts = _with_retry_defaults(group, keystoneauth_opts())
        for i, (g, opts) in enumerate(out):
            if g == group:
                out[i] = (g, opts + ks_opts)
                break
        else:
            out.append((group, ks_opts))
    from acceld import privileged

    out += privileged.list_opts()
    # [keystone_authtoken], [oslo_limit], [oslo_policy], [healthcheck], [cors] and
    # [oslo_middleware] belong to their libraries' namespaces: etc/acceld/
    # acceld-config-generator.conf lists them beside this one (acceld.sample.NAMESPACES).
    return out


def _with_retry_defaults(group: str, opts: list[cfg.Opt]) -> list[cfg.Opt]:
    """``opts`` with acceld's KEYSTONEAUTH_RETRIES defaults of ``group``, so that the sample
    shows the values in force."""
    wanted = KEYSTONEAUTH_RETRIES.get(group, {})
    out = []
    for opt in opts:
        if opt.dest in wanted:
            opt = copy.copy(opt)
            opt.default = wanted[opt.dest]
        out.append(opt)
    return out


def keystoneauth_opts() -> list[cfg.Opt]:
    """keystoneauth's session, adapter and auth options, with the password plugin's
    (auth_url, username, password, ...): what a sample shows for [placement], [nova] and
    [glance], as other services' samples do."""
    opts: list[cfg.Opt] = []
    for more in (ks_loading.get_session_conf_options(),
                 ks_loading.get_adapter_conf_options(),
                 ks_loading.get_auth_common_conf_options(),
                 ks_loading.get_auth_plugin_conf_options("password")):
        opts += [o for o in more if o.dest not in {x.dest for x in opts}]
    return opts


def set_lib_defaults() -> None:
    """acceld's defaults for library options (oslo.config.opts.defaults entry point, so
    that generated samples show them): CORS lets browsers send and read the headers the
    API uses."""
    from oslo_middleware import cors

    cors.set_defaults(
        allow_headers=["X-Auth-Token", "X-OpenStack-Request-ID", "X-Identity-Status",
                       "X-Roles", "X-Service-Catalog", "X-User-Id", "X-Project-Id",
                       "OpenStack-API-Version"],
        expose_headers=["X-Auth-Token", "X-OpenStack-Request-ID", "X-Subject-Token",
                        "X-Service-Token", "OpenStack-API-Version"],
        allow_methods=["GET", "PUT", "POST", "DELETE", "PATCH"])


def load(argv: Sequence[str] = (), config_files: Sequence[str] | None = None,
         conf: cfg.ConfigOpts | None = None, config_dirs: Sequence[str] | None = None,
         discover: bool = False) -> cfg.ConfigOpts:
    """Parse config files and the environment into ``conf`` (default: the global CONF).

    ``discover`` (the commands): without ``config_files`` and ``config_dirs``, read what
    oslo.config finds in the standard places, as every OpenStack service does
    (acceld.conf in ~/.acceld/, ~/, /etc/acceld/, /etc/; acceld.conf.d/ there). None
    found: the built-in defaults (the all-in-one's). In-process callers (tests) read
    only what they name."""
    conf = conf if conf is not None else CONF
    register_opts(conf)
    files = list(config_files or [])
    dirs = list(config_dirs or [])
    if discover and not files and not dirs:
        # (oslo lists project and program files apart: the same name here, found once)
        files = list(dict.fromkeys(cfg.find_config_files(project="acceld", prog="acceld")))
        dirs = list(dict.fromkeys(cfg.find_config_dirs(project="acceld", prog="acceld")))
    conf(list(argv), project="acceld", prog="acceld", default_config_files=files,
         default_config_dirs=dirs, validate_default_values=True)
    from acceld import upstream_conf

    upstream_conf.adopt_defaults(conf)  # an upstream cyborg.conf means Keystone
    return conf


def database_url(conf: cfg.ConfigOpts) -> str:
    """The configured database URL, defaulting to SQLite under the state path."""
    if conf.database.connection:
        return conf.database.connection
    path = os.path.abspath(os.path.join(conf.state_path, "acceld.sqlite"))
    return f"sqlite:///{path}"
