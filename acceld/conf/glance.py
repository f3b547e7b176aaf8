"""``[glance]``: how the agent downloads bitstreams and firmware from Glance: keystoneauth's
options only (acceld.conf._keystoneauth)."""

from __future__ import annotations

from oslo_config import cfg

from acceld.conf import _keystoneauth

glance_group = cfg.OptGroup("glance", title="The image service")

glance_opts: list[cfg.Opt] = []


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(glance_opts, group=glance_group.name)
    _keystoneauth.register_opts(conf, glance_group)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {glance_group: glance_opts + _keystoneauth.list_opts(glance_group)}
