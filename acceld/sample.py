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
    from acceld.api.policy import RULES

    out = io.StringIO()
    out.write("# acceld policy. Uncomment a rule to override its default.\n")
    for rule in RULES:
        out.write("\n")
        for line in textwrap.wrap(rule.description or "", 76):
            out.write(f"# {line}\n")
        for op in getattr(rule, "operations", None) or []:
            out.write(f"# {op['method']}  {op['path']}\n")
        out.write(f'#"{rule.name}": "{rule.check_str}"\n')
    return out.getvalue()
