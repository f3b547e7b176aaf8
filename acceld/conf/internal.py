"""``[internal]``: the internal API between the API, the conductors, the agents and driver
processes: its secrets, its servers' limits, TLS."""

from __future__ import annotations

from oslo_config import cfg

internal_group = cfg.OptGroup("internal", title="Internal API")

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


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(internal_opts, group=internal_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {internal_group: internal_opts}
