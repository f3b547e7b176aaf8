"""Commented samples of the config file and the policy file."""

from __future__ import annotations

import io
import textwrap

from oslo_config import cfg

from acceld import config


def config_sample() -> str:
    out = io.StringIO()
    out.write("# acceld configuration. Every option shows its default.\n"
              "# Any option can also be set in the environment as OS_<GROUP>__<OPTION>.\n")
    for group, opts in config.list_opts():
        out.write(f"\n[{group}]\n")
        for opt in opts:
            out.write("\n")
            for line in textwrap.wrap(opt.help or "", 76):
                out.write(f"# {line}\n")
            kind = type(opt).__name__.replace("Opt", "").lower() or "string"
            out.write(f"# ({kind})\n")
            out.write(f"#{opt.dest} = {_default(opt)}\n")
    return out.getvalue()


def _default(opt: cfg.Opt) -> str:
    if opt.sample_default is not None:
        return str(opt.sample_default)
    if opt.default is None:
        return "<None>"
    if isinstance(opt.default, list):
        return ",".join(str(v) for v in opt.default)
    if isinstance(opt.default, bool):
        return str(opt.default).lower()
    return str(opt.default)


def policy_sample() -> str:
    """Every rule as YAML an operator can copy into policy.yaml: description, operations,
    scope, the default (commented out) and, for a replaced rule, the deprecated one."""
    from acceld.api.policy import RULES

    out = io.StringIO()
    out.write("# acceld policy (upstream Cyborg's rule names and defaults).\n"
              "# Uncomment a rule to override its default. The file is\n"
              "# [oslo_policy] policy_file (default policy.yaml beside the config file).\n")
    for rule in RULES:
        out.write("\n")
        for line in textwrap.wrap(rule.description or "", 76):
            out.write(f"# {line}\n")
        for op in getattr(rule, "operations", None) or []:
            out.write(f"# {op['method']}  {op['path']}\n")
        if rule.scope_types:
            out.write(f"# Intended scope(s): {', '.join(rule.scope_types)}\n")
        if rule.deprecated_for_removal:
            out.write(f"# DEPRECATED: {rule.name!r} is deprecated for removal since "
                      f"{rule.deprecated_since}.\n")
            for line in textwrap.wrap(rule.deprecated_reason or "", 76):
                out.write(f"# {line}\n")
        out.write(f'#"{rule.name}": "{rule.check_str}"\n')
        old = rule.deprecated_rule
        if old is not None:
            out.write(f'# DEPRECATED\n# "{old.name}":"{old.check_str}" has been deprecated since '
                      f'{old.deprecated_since} in favor of "{rule.name}":"{rule.check_str}".\n')
            for line in textwrap.wrap(old.deprecated_reason or "", 76):
                out.write(f"# {line}\n")
    return out.getvalue()
