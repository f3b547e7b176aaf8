"""``[quota]``: how many ARQs a project may hold (acceld.api.arq_limits), and
``[oslo_limit]``: how to reach Keystone's unified limits ([quota] driver =
unified_limits), oslo.limit's own options (its namespace lists them in the sample)."""

from __future__ import annotations

from oslo_config import cfg

from acceld.conf._keystoneauth import KEYSTONE_TIMEOUT

quota_group = cfg.OptGroup("quota", title="ARQ quotas")

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


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Also ``[oslo_limit]``: oslo.limit reads it from oslo.config's global CONF, which is
    the configuration every acceld service loads."""
    from oslo_limit import opts as limit_opts

    conf.register_opts(quota_opts, group=quota_group.name)
    limit_opts.register_opts(conf)
    limit_opts.CONF.set_default("timeout", KEYSTONE_TIMEOUT, group="oslo_limit")


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {quota_group: quota_opts}
