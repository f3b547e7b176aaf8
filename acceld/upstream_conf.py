"""Running from upstream Cyborg's cyborg.conf: what acceld takes from it and what it does not.

acceld reads an upstream ``cyborg.conf`` as it stands (docs/nova.md and the README's
"Replacing upstream Cyborg"): renamed options have oslo.config deprecated aliases
(acceld.conf), upstream's driver names map to acceld's (acceld.drivers.loader), and
this module does the rest at start:

* an upstream file sets no ``auth_strategy`` (upstream always validates Keystone tokens,
  in its paste pipeline): a file with a ``[keystone_authtoken]`` section and no
  ``auth_strategy`` means ``keystone``, never acceld's noauth default;
* the options the files set that acceld does not use (``transport_url``, oslo.db's pool
  tuning, ``[oslo_concurrency]``, ...) are named in one WARNING, so that nothing an
  operator set is ignored without a word.
"""

from __future__ import annotations

import glob
import logging
import os

from oslo_config import cfg

LOG = logging.getLogger(__name__)

# Sections whose options libraries register only as they use them (keystonemiddleware's
# [keystone_authtoken], keystoneauth's auth plugins in [nova], [placement], [glance] and
# [oslo_limit], oslo.privsep's contexts): not checked, as an unregistered option there
# may well be read.
DYNAMIC_SECTIONS = ("keystone_authtoken", "nova", "placement", "glance", "oslo_limit")
DYNAMIC_PREFIXES = ("privsep",)

# oslo.messaging's [DEFAULT] options, which upstream's RPC reads and acceld has no use for.
_BROKER = ("transport_url", "control_exchange", "rpc_response_timeout",
           "executor_thread_pool_size", "rpc_conn_pool_size", "rpc_ping_enabled")
# What acceld does instead, for the upstream options an operator most likely relied on.
HINTS = {
    **{("DEFAULT", name): "acceld uses no message broker" for name in _BROKER},
    ("api", "api_paste_config"): "acceld builds its own pipeline; [DEFAULT] auth_strategy",
    ("api", "enable_ssl_api"): "use [api] tls_cert_file and tls_key_file",
    ("agent", "resource_provider_name"):
        "acceld finds the compute node's provider by [DEFAULT] host",
    ("gpu_devices", "enabled_vgpu_types"):
        "acceld's is [nvidia_gpu] enabled_vgpu_types, which offers every GPU of the type",
    ("nvme", "device_spec"): "acceld offers the controllers in [nvme] addresses",
    ("service_user", None): "acceld sends Nova its events with [nova]'s credentials",
}


def config_files(conf: cfg.ConfigOpts) -> list[str]:
    """The files ``conf`` was parsed from, in order: --config-file, then each
    --config-dir's ``*.conf`` in name order (as oslo.config reads them)."""
    files = list(conf.config_file or [])
    dirs = conf.config_dir or []
    for directory in [dirs] if isinstance(dirs, str) else dirs:
        files += sorted(glob.glob(os.path.join(directory, "*.conf")))
    return [f for f in files if os.path.isfile(f)]


def file_options(paths: list[str]) -> dict[str, set[str]]:
    """Section -> option names set in ``paths`` (oslo.config's own parser)."""
    found: dict[str, set[str]] = {}
    for path in paths:
        sections: dict[str, dict[str, list[str]]] = {}
        try:
            cfg.ConfigParser(path, sections).parse()
        except (OSError, cfg.ParseError):
            continue  # oslo.config itself reported it when it parsed the file
        for section, options in sections.items():
            found.setdefault(section, set()).update(
                name.replace("-", "_") for name in options)
    return found


def _registered(conf: cfg.ConfigOpts) -> dict[str, set[str]]:
    """Section -> option names some registered option reads, deprecated aliases included.
    (oslo.config has no public listing of deprecated names: its option tables are read.)"""
    out: dict[str, set[str]] = {}
    tables = [("DEFAULT", conf._opts)]  # noqa: SLF001
    tables += [(name, group._opts) for name, group in conf._groups.items()]  # noqa: SLF001
    for group, opts in tables:
        for info in opts.values():
            opt = info["opt"]
            out.setdefault(group, set()).add(opt.dest)
            for old in opt.deprecated_opts:
                old_group = old.group or group
                old_name = (old.name or opt.dest).replace("-", "_")
                out.setdefault(old_group, set()).add(old_name)
    return out


def _dynamic(section: str) -> bool:
    return section in DYNAMIC_SECTIONS or section.startswith(DYNAMIC_PREFIXES)


def unused(conf: cfg.ConfigOpts) -> list[str]:
    """The options ``conf``'s files set that acceld does not read, as ``[group] name``
    (``[group]`` alone for a whole section acceld does not know), each with its hint."""
    known = _registered(conf)
    names: list[str] = []
    for section, options in sorted(file_options(config_files(conf)).items(),
                                   key=lambda item: (item[0] != "DEFAULT", item[0])):
        if _dynamic(section):
            continue
        if section not in known:
            hint = HINTS.get((section, None))
            names.append(f"[{section}]" + (f" ({hint})" if hint else ""))
            continue
        for name in sorted(options - known[section]):
            hint = HINTS.get((section, name))
            names.append(f"[{section}] {name}" + (f" ({hint})" if hint else ""))
    return names


def warn_unused(conf: cfg.ConfigOpts) -> list[str]:
    """Log the options acceld does not use in one WARNING; the names, for callers."""
    names = unused(conf)
    if names:
        LOG.warning("Options set in %s that acceld does not use (upstream Cyborg's, or "
                    "misspelt): %s", ", ".join(config_files(conf)), "; ".join(names))
    return names


def adopt_defaults(conf: cfg.ConfigOpts) -> None:
    """Defaults an upstream cyborg.conf implies: Keystone authentication when the files
    configure ``[keystone_authtoken]`` and say nothing of ``auth_strategy``."""
    if conf.get_location("auth_strategy").location is not cfg.Locations.opt_default:
        return
    sections = file_options(config_files(conf))
    if sections.get("keystone_authtoken"):
        conf.set_default("auth_strategy", "keystone")
