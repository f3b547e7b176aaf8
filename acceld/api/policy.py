"""Policy: upstream Cyborg's rule names and defaults, enforced with oslo.policy.

Every rule upstream Cyborg registers exists here with the same name and the
same default, including the legacy base rules and, for each API rule, the
deprecated rule it replaced (oslo.policy ``DeprecatedRule``). acceld sets
``[oslo_policy] enforce_new_defaults = True`` by default, so only the new
persona defaults apply; an operator who sets it to False gets upstream's
transition behaviour (new default OR the deprecated rule).

Upstream evaluates every rule against the caller's own project and keeps
tenants apart in its queries; acceld does the same (handlers filter by
project and answer 404 for another project's data). Operators override rules
in a policy file (``[oslo_policy] policy_file``, default ``policy.yaml``,
found next to the config files).
"""

from __future__ import annotations

import logging
import time

from oslo_config import cfg
from oslo_policy import policy

from acceld.api import errors
from acceld.api.context import RequestContext

LOG = logging.getLogger(__name__)

# Release names, as oslo.log's versionutils spells them (not imported: oslo.log is not a
# dependency of acceld).
WALLABY = "W"
GAZPACHO = "G"

ADMIN = "role:admin"
PROJECT_ADMIN = "role:admin and project_id:%(project_id)s"
PROJECT_MEMBER = "role:member and project_id:%(project_id)s"
PROJECT_READER = "role:reader and project_id:%(project_id)s"
PROJECT_MANAGER = "role:manager and project_id:%(project_id)s"
SERVICE = "role:service"

_LEGACY_REASON = ("The legacy rules predate the reader/member/manager/admin personas and "
                  "project scope. They are kept so that policy files written for them still "
                  "parse, and will be removed.")

# Rule names the API rules' defaults refer to.
_ADMIN = "rule:admin_api"
_READER_OR_ADMIN = "rule:project_reader_or_admin"
_MEMBER_OR_SERVICE = "rule:project_member_or_service"
_MANAGER_OR_ADMIN = "rule:project_manager_or_admin"
# The deprecated defaults the API rules replaced.
_OLD_OWNER = "rule:admin_or_owner"
_OLD_IS_ADMIN = "rule:is_admin"
_OLD_MEMBER_OR_ADMIN = "rule:project_member_or_admin"

_admin_or_owner_deprecated = policy.DeprecatedRule(
    name="admin_or_owner", check_str="is_admin:True or project_id:%(project_id)s",
    deprecated_reason="Replaced by the persona rules (reader, member, manager, admin).",
    deprecated_since=WALLABY)

BASE_RULES = [
    policy.RuleDefault("admin_api", ADMIN, "Administrators of the cloud."),
    policy.RuleDefault("project_admin_api", PROJECT_ADMIN,
                       "Administrators of the target project."),
    policy.RuleDefault("project_member_api", PROJECT_MEMBER, "Members of the target project."),
    policy.RuleDefault("project_reader_api", PROJECT_READER, "Readers of the target project."),
    policy.RuleDefault("project_manager_api", PROJECT_MANAGER,
                       "Managers of the target project."),
    policy.RuleDefault("service_api", SERVICE,
                       "Other OpenStack services (Nova), by the service role."),
    policy.RuleDefault("project_member_or_admin", "rule:project_member_api or rule:admin_api",
                       "Members of the target project, or administrators.",
                       deprecated_rule=_admin_or_owner_deprecated),
    policy.RuleDefault("project_reader_or_admin", "rule:project_reader_api or rule:admin_api",
                       "Readers of the target project, or administrators.",
                       deprecated_rule=_admin_or_owner_deprecated),
    policy.RuleDefault("project_manager_or_admin", "rule:project_manager_api or rule:admin_api",
                       "Managers of the target project, or administrators."),
    policy.RuleDefault("project_member_or_service", "rule:project_member_api or rule:service_api",
                       "Members of the target project, or services."),
]


def _legacy(name: str, check: str, description: str) -> policy.RuleDefault:
    return policy.RuleDefault(name, check, description, deprecated_for_removal=True,
                              deprecated_reason=_LEGACY_REASON, deprecated_since=WALLABY)


LEGACY_RULES = [
    _legacy("public_api", "is_public_api:True", "Legacy: requests to public routes."),
    _legacy("allow", "@", "Legacy: always allowed."),
    _legacy("deny", "!", "Legacy: never allowed."),
    _legacy("default", "rule:admin_or_owner", "Legacy: the rule used when none is named."),
    _legacy("is_admin", "rule:admin_api", "Legacy: full API access."),
    _legacy("admin_or_owner", "is_admin:True or project_id:%(project_id)s",
            "Legacy: administrators or the owning project."),
    _legacy("admin_or_user", "is_admin:True or user_id:%(user_id)s",
            "Legacy: administrators or the owning user."),
]


def _deprecated(name: str, old: str, reason: str, since: str = GAZPACHO) -> policy.DeprecatedRule:
    return policy.DeprecatedRule(name=name, check_str=old, deprecated_reason=reason,
                                 deprecated_since=since)


def _op(name: str, check: str, operations: list[tuple[str, str]], description: str,
        old: str | None = None, reason: str = "", since: str = GAZPACHO,
        ) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=name, check_str=check, description=description,
        operations=[{"method": m, "path": p} for m, p in operations],
        scope_types=["project"],
        deprecated_rule=_deprecated(name, old, reason, since) if old else None)


_ARQ_READ = "Readers of the owning project may now read its ARQs explicitly."
_ARQ_WRITE = "ARQ writes moved to the member and service personas."
_INVENTORY_READ = ("Project managers may now read the hardware inventory (capacity planning, "
                   "troubleshooting).")
_INVENTORY_WRITE = "Changing shared hardware stays with administrators."
_DP_READ = "The owner rule was too strict for reading device profiles."
_DP_WRITE = "Device profiles are shared by every project: only administrators change them."

ARQ = "/v2/accelerator_requests"
DP = "/v2/device_profiles"

API_RULES = [
    _op("cyborg:arq:get_all", _READER_OR_ADMIN, [("GET", ARQ)], "List ARQs.",
        _OLD_OWNER, _ARQ_READ),
    _op("cyborg:arq:get_one", _READER_OR_ADMIN, [("GET", ARQ + "/{arqs_uuid}")], "Show an ARQ.",
        _OLD_OWNER, _ARQ_READ),
    _op("cyborg:arq:create", _MEMBER_OR_SERVICE, [("POST", ARQ)], "Create ARQs.",
        _OLD_MEMBER_OR_ADMIN, _ARQ_WRITE),
    _op("cyborg:arq:delete", _MEMBER_OR_SERVICE,
        [("DELETE", ARQ), ("DELETE", ARQ + "/{arqs_uuid}")], "Delete ARQs.",
        _OLD_OWNER, _ARQ_WRITE),
    _op("cyborg:arq:update", _MEMBER_OR_SERVICE,
        [("PATCH", ARQ), ("PATCH", ARQ + "/{arqs_uuid}")], "Bind or unbind ARQs.",
        _OLD_OWNER, _ARQ_WRITE),
    _op("cyborg:device_profile:get_all", _READER_OR_ADMIN, [("GET", DP)],
        "List device profiles.", _OLD_OWNER, _DP_READ, WALLABY),
    _op("cyborg:device_profile:get_one", _READER_OR_ADMIN,
        [("GET", DP + "/{device_profiles_uuid}")], "Show a device profile.",
        _OLD_OWNER, _DP_READ, WALLABY),
    _op("cyborg:device_profile:create", _ADMIN, [("POST", DP)], "Create a device profile.",
        _OLD_IS_ADMIN, _DP_WRITE, WALLABY),
    _op("cyborg:device_profile:delete", _ADMIN,
        [("DELETE", DP + "/{device_profiles_uuid}"),
         ("DELETE", DP + "?value={device_profile_name1}")], "Delete device profiles.",
        _OLD_OWNER, _DP_WRITE, WALLABY),
    _op("cyborg:device:get_all", _MANAGER_OR_ADMIN, [("GET", "/v2/devices")], "List devices.",
        _ADMIN, _INVENTORY_READ),
    _op("cyborg:device:get_one", _MANAGER_OR_ADMIN, [("GET", "/v2/devices/{uuid}")],
        "Show a device.", _ADMIN, _INVENTORY_READ),
    _op("cyborg:device:disable", _ADMIN,
        [("POST", "/v2/devices/{uuid}/disable"), ("PATCH", "/v2/devices/{uuid}")],
        "Disable a device (maintenance).", _ADMIN, _INVENTORY_WRITE),
    _op("cyborg:device:enable", _ADMIN,
        [("POST", "/v2/devices/{uuid}/enable"), ("PATCH", "/v2/devices/{uuid}")],
        "Enable a device.", _ADMIN, _INVENTORY_WRITE),
    _op("cyborg:deployable:get_all", _MANAGER_OR_ADMIN, [("GET", "/v2/deployables")],
        "List deployables.", _ADMIN, _INVENTORY_READ),
    _op("cyborg:deployable:get_one", _MANAGER_OR_ADMIN, [("GET", "/v2/deployables/{uuid}")],
        "Show a deployable.", _ADMIN, _INVENTORY_READ),
    _op("cyborg:deployable:program", _ADMIN,
        [("PATCH", "/v2/deployables/{uuid}/program"), ("PATCH", "/v2/deployables/{uuid}")],
        "Program a deployable (FPGA bitstream).", _ADMIN, _INVENTORY_WRITE),
    _op("cyborg:attribute:get_all", _MANAGER_OR_ADMIN, [("GET", "/v2/attributes")],
        "List attributes.", _ADMIN, _INVENTORY_READ),
    _op("cyborg:attribute:get_one", _MANAGER_OR_ADMIN, [("GET", "/v2/attributes/{uuid}")],
        "Show an attribute.", _ADMIN, _INVENTORY_READ),
    # Upstream never changed these two, so they have no deprecated rule.
    _op("cyborg:attribute:create", _ADMIN, [("POST", "/v2/attributes")],
        "Create an attribute."),
    _op("cyborg:attribute:delete", _ADMIN, [("DELETE", "/v2/attributes/{uuid}")],
        "Delete an attribute."),
    # acceld's own (microversion 2.4).
    _op("acceld:host:get_all", _ADMIN, [("GET", "/v2/hosts")],
        "List agents and their liveness."),
    # acceld 2.5.
    _op("acceld:host:delete", _ADMIN, [("DELETE", "/v2/hosts/{hostname}")],
        "Retire a host: remove its inventory, agent and Placement providers."),
    # acceld 2.6: device health. Without this rule a device reader sees no health fields and
    # may not filter by them.
    _op("acceld:device:get_health", _ADMIN,
        [("GET", "/v2/devices"), ("GET", "/v2/devices/{uuid}")],
        "See devices' health, quarantine and bound instances; filter by health."),
    _op("acceld:device_event:get_all", _ADMIN, [("GET", "/v2/devices/{uuid}/events")],
        "List a device's events (health, quarantine, operator, programs, vanish)."),
    _op("acceld:device:return_to_service", _ADMIN, [("PATCH", "/v2/devices/{uuid}")],
        "Return a device quarantined for its health to service."),
    # acceld 2.7: the reasons name hosts, devices, ARQs and instances of every project.
    _op("acceld:device_profile:explain", _ADMIN,
        [("GET", DP + "/{device_profiles_uuid}/explain")],
        "Explain why a device profile can or cannot get an accelerator, per host."),
    # acceld 2.8: standalone claims, for workloads that are not Nova instances; a caller
    # needs cyborg:arq:create (or cyborg:arq:delete) as well.
    _op("acceld:arq:claim", "rule:project_member_api", [("POST", ARQ)],
        "Claim accelerators without Nova: acceld picks the host and provider, writes the "
        "Placement allocation and binds (POST with \"claim\")."),
    _op("acceld:arq:release", "rule:project_member_api",
        [("DELETE", ARQ), ("DELETE", ARQ + "/{arqs_uuid}")],
        "Release a standalone claim: its attach handle and its Placement allocation."),
]

RULES = BASE_RULES + LEGACY_RULES + API_RULES

# Upstream's rule names, checked by the tests: none may go missing.
UPSTREAM_RULE_NAMES = frozenset(r.name for r in RULES if not r.name.startswith("acceld:"))


def list_rules() -> list[policy.RuleDefault]:
    """Entry point for oslopolicy-sample-generator and `acceld policy sample`."""
    return list(RULES)


def get_enforcer() -> policy.Enforcer:
    """Entry point (oslo.policy.enforcer) for oslopolicy-policy-generator (the effective
    policy, which oslopolicy-checker then evaluates) and friends: an enforcer with acceld's rules over acceld's configuration (the
    files the tool was given, else the standard locations, for [oslo_policy])."""
    from acceld import config
    from acceld.conf import policy as policy_opts

    conf = cfg.CONF
    if getattr(conf, "_args", None) is None:  # the tool has not parsed a configuration
        config.load(discover=True, conf=conf)
    else:  # the tool's own command line is parsed: add only what the enforcer reads
        policy_opts.register_opts(conf)
    enforcer = policy.Enforcer(conf)
    enforcer.register_defaults(RULES)
    return enforcer


class Policy:
    """The process's enforcer, with its decisions memoised.

    oslo.policy re-checks the policy file and introspects every check on each
    call (about half a millisecond). A decision depends only on the rule, the
    caller's identity and the target, so it is cached; the cache is dropped
    whenever the rules are reloaded, at most every RELOAD_SECONDS, which keeps
    edits to the policy file taking effect without a restart.
    """

    RELOAD_SECONDS = 5.0
    MAX_CACHED = 10000

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.enforcer = policy.Enforcer(conf)
        self.enforcer.register_defaults(RULES)
        self._decisions: dict[tuple, bool] = {}
        self._loaded_at = float("-inf")

    def authorize(self, rule: str, ctx: RequestContext, target: dict | None = None) -> None:
        """403 unless ``ctx`` may do ``rule``. The default target is the caller's project."""
        self._require_scope(rule, ctx)
        if not self._allowed(rule, ctx, target):
            raise errors.Forbidden(f"Policy doesn't allow {rule} to be performed.")

    def allows(self, rule: str, ctx: RequestContext, target: dict | None = None) -> bool:
        """Whether ``ctx`` may do ``rule``, for what a response shows rather than refuses."""
        return self._scope_allows(rule, ctx) and self._allowed(rule, ctx, target)

    def _scope_allows(self, rule: str, ctx: RequestContext) -> bool:
        """A token without a project passes only rules registered for its scope.

        Every per-project filter reads the caller's project: a domain- or system-scoped
        token would otherwise reach them with none, and none must never mean "every
        project". So such a token is refused here, before any rule is evaluated and
        whatever ``[oslo_policy] enforce_scope`` says, unless the rule's registered
        ``scope_types`` name its scope (none of acceld's rules do today)."""
        if ctx.project_id and ctx.scope == "project":
            return True
        registered = self.enforcer.registered_rules.get(rule)
        return registered is not None and ctx.scope in (registered.scope_types or ())

    def _require_scope(self, rule: str, ctx: RequestContext) -> None:
        if not self._scope_allows(rule, ctx):
            LOG.debug("policy %s: denied, a %s-scoped token", rule, ctx.scope)
            raise errors.Forbidden(
                f"Policy doesn't allow {rule} to be performed with a {ctx.scope}-scoped token; "
                "use a token scoped to a project.")

    def _allowed(self, rule: str, ctx: RequestContext, target: dict | None) -> bool:
        if target is None:
            target = {"project_id": ctx.project_id, "user_id": ctx.user_id}
        now = time.monotonic()
        if now - self._loaded_at > self.RELOAD_SECONDS or len(self._decisions) > self.MAX_CACHED:
            self.enforcer.load_rules()
            self._decisions.clear()
            self._loaded_at = now
        key = (rule, ctx.cache_key(), tuple(sorted(target.items())))
        allowed = self._decisions.get(key)
        if allowed is None:
            try:
                allowed = bool(self.enforcer.authorize(rule, target, ctx.policy_credentials(),
                                                       do_raise=False))
            except policy.InvalidScope:
                allowed = False
            self._decisions[key] = allowed
            cached = ""
        else:
            cached = " (cached)"
        if LOG.isEnabledFor(logging.DEBUG):
            LOG.debug("policy %s: %s for roles %s on %s%s", rule,
                      "allowed" if allowed else "denied", sorted(ctx.roles), target, cached)
        return allowed
