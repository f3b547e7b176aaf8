"""``[privsep_sysfs]``, ``[privsep_tools]``, ``[privsep_nvml]``: oslo.privsep's options of
each context acceld.privileged starts (helper_command, capabilities, ...), each with the
capabilities its daemon keeps. oslo.privsep registers them when a context starts; they
are listed here for the sample only, so that registering acceld's options loads no
oslo.privsep in the services that never call it (the API, the conductor)."""

from __future__ import annotations

import copy

from oslo_config import cfg

# What each daemon keeps, by capability name (acceld.privileged; docs/security.md):
# sysfs writes CAP_DAC_OVERRIDE (root-owned attributes of mode 0200); vendor tools also
# CAP_SYS_ADMIN (device nodes and flash partitions); NVML's GPU instances CAP_SYS_ADMIN.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "privsep_sysfs": ("CAP_DAC_OVERRIDE",),
    "privsep_tools": ("CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE"),
    "privsep_nvml": ("CAP_SYS_ADMIN",),
}


def capabilities(section: str) -> tuple[int, ...]:
    """The capabilities the context of ``section`` keeps, as oslo.privsep's numbers."""
    from oslo_privsep import capabilities as caps

    return tuple(caps.CAPS_BYNAME[name] for name in CAPABILITIES[section])


# Appended to oslo.privsep's own help of helper_command: what acceld's deployments set.
HELPER_COMMAND_HELP = (
    " acceld: sudo /opt/acceld/bin/acceld-privsep-helper --config-file "
    "/etc/acceld/acceld.conf, the command etc/sudoers.d/acceld-privsep allows (README.md, "
    "docs/security.md). The generated default runs oslo.privsep's privsep-helper, which "
    "those rules do not allow.")


def list_opts() -> dict[str, list[cfg.Opt]]:
    from oslo_privsep import priv_context

    out = {}
    for section, names in CAPABILITIES.items():
        opts = copy.deepcopy(priv_context.OPTS)
        for opt in opts:
            if opt.dest == "capabilities":
                opt.default = list(capabilities(section))
                opt.sample_default = ",".join(names)
            if opt.dest == "helper_command":
                opt.help += HELPER_COMMAND_HELP
        out[section] = opts
    return out
