"""The policy part of ``acceld-status upgrade check``: the file parses, refers to no
undefined rule, and uses no deprecated rule (a legacy rule acceld will remove, or a
rule's deprecated default written back into the file). With ``[oslo_policy]
enforce_new_defaults = False`` (upstream Cyborg's transition setting) oslo.policy warns
once per rule still allowed by its deprecated default; those warnings are caught and
said once, in this check's result."""

from __future__ import annotations

import re
import warnings

from oslo_config import cfg
from oslo_policy import policy
from oslo_upgradecheck.upgradecheck import Code, Result

from acceld.api.policy import RULES

_REFERENCE = re.compile(r"rule:([A-Za-z0-9_:.-]+)")
# oslo.policy's UserWarning for a rule whose deprecated default still applies, and for a
# legacy rule in the file (which _deprecated_uses names already).
_DEPRECATED_DEFAULT = re.compile(r'^Policy "([^"]+)":".*" was deprecated in ')
_FOR_REMOVAL = re.compile(r'^Policy "[^"]+":".*" was deprecated for removal ')


def check_policy(conf: cfg.ConfigOpts) -> Result:
    enforcer = policy.Enforcer(conf)
    enforcer.register_defaults(RULES)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enforcer.load_rules(force_reload=True)
    except Exception as exc:  # noqa: BLE001 - any parse error is the finding
        return Result(Code.FAILURE, f"The policy file cannot be read: {exc}")
    transition = _transition(caught)
    if not enforcer.policy_path:
        if transition:
            return Result(Code.WARNING, f"No policy file ({conf.oslo_policy.policy_file}); "
                                        + transition)
        return Result(Code.SUCCESS, f"No policy file ({conf.oslo_policy.policy_file}): "
                                    "every rule has its default.")
    if not enforcer.check_rules():
        return Result(Code.FAILURE, f"{enforcer.policy_path} refers to an undefined rule "
                                    "or has a cycle of rules (oslopolicy-validator --namespace "
                                    "acceld names them).")
    findings = _deprecated_uses(enforcer.file_rules) + ([transition] if transition else [])
    if findings:
        return Result(Code.WARNING, f"{enforcer.policy_path}: " + "; ".join(findings))
    return Result(Code.SUCCESS, f"{enforcer.policy_path}: valid, no deprecated rule in use.")


def _transition(caught: list[warnings.WarningMessage]) -> str:
    """One finding for oslo.policy's per-rule deprecation warnings ("" when none); a
    legacy rule's is dropped (named by _deprecated_uses), any other is shown as it came."""
    names = []
    for warning in caught:
        found = _DEPRECATED_DEFAULT.match(str(warning.message))
        if found is None and _FOR_REMOVAL.match(str(warning.message)):
            continue
        if found is None:
            warnings.showwarning(warning.message, warning.category, warning.filename,
                                 warning.lineno)
        elif found.group(1) not in names:
            names.append(found.group(1))
    if not names:
        return ""
    return (f"[oslo_policy] enforce_new_defaults = False: {len(names)} rule(s) keep their "
            f"deprecated default beside the new one ({', '.join(map(repr, sorted(names)))}), "
            "which is more permissive; set it to True once the cloud's roles fit the new "
            "defaults (docs/security.md)")


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
