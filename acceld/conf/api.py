"""``[api]``: the public REST API's listener, workers, limits and authentication."""

from __future__ import annotations

from oslo_config import cfg

api_group = cfg.OptGroup("api", title="The public API")

api_opts = [
    cfg.HostAddressOpt("host_ip", default="127.0.0.1", help="Address the public API listens on."),
    cfg.PortOpt("port", default=6666, help="Port the public API listens on."),
    cfg.IntOpt("workers", default=2, min=1, deprecated_name="api_workers",
               help="Number of API worker processes (gunicorn workers, each serving with "
                    "[api] threads threads; acceld.serving.api_worker)."),
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


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(api_opts, group=api_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {api_group: api_opts}
