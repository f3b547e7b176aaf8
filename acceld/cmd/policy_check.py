"""The policy part of ``acceld-status upgrade check``: the file parses, refers to no
undefined rule, and uses no deprecated rule (a legacy rule acceld will remove, or a
rule's deprecated default written back into the file)."""

from __future__ import annotations

import re

from oslo_config import cfg
from oslo_policy import policy
from oslo_upgradecheck.upgradecheck import Code, Result

from acceld.api.policy import RULES

_REFERENCE = re.compile(r"rule:([A-Za-z0-9_:.-]+)")


def check_policy(conf: cfg.ConfigOpts) -> Result:
    enforcer = policy.Enforcer(conf)
    enforcer.register_defaults(RULES)
    try:
        enforcer.load_rules(force_reload=True)
    except Exception as exc:  # noqa: BLE001 - any parse error is the finding
        return Result(Code.FAILURE, f"The policy file cannot be read: {exc}")
    if not enforcer.policy_path:
        return Result(Code.SUCCESS, f"No policy file ({conf.oslo_policy.policy_file}): "
                                    "every rule has its default.")
    if not enforcer.check_rules():
        return Result(Code.FAILURE, f"{enforcer.policy_path} refers to an undefined rule "
                                    "or has a cycle of rules (oslopolicy-validator --namespace "
                                    "acceld names them).")
    findings = _deprecated_uses(enforcer.file_rules)
    if findings:
        return Result(Code.WARNING, f"{enforcer.policy_path}: " + "; ".join(findings))
    return Result(Code.SUCCESS, f"{enforcer.policy_path}: valid, no deprecated rule in use.")


def _deprecated_uses(file_rules: dict[str, policy.RuleDefault]) -> list[str]:
    registered = {rule.name: rule for rule in RULES}
    legacy = {rule.name for rule in RULES if rule.deprecated_for_removal}
    findings = []
    for name, rule in sorted(file_rules.items()):
        known = registered.get(name)
        if known is None:
            findings.append(f"{name!r} is not an acceld rule (ignored)")
            continue
        if name in legacy:
            findings.append(f"{name!r} is deprecated for removal")
        used = sorted(set(_REFERENCE.findall(rule.check_str)) & legacy)
        if used:
            findings.append(f"{name!r} refers to deprecated {', '.join(map(repr, used))}")
        old = known.deprecated_rule
        if old is not None and rule.check_str.strip() == old.check_str:
            findings.append(f"{name!r} sets its deprecated default {old.check_str!r}")
    return findings
