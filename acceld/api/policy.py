"""Policy: upstream Cyborg's rule names and defaults, enforced with oslo.policy.

Upstream evaluates every rule against the caller's own project, and keeps
tenants apart in its queries; acceld does the same (handlers filter by
project). Operators override rules in a policy file (``[oslo_policy]``).
"""

from __future__ import annotations

import time

from oslo_config import cfg
from oslo_policy import policy

from acceld.api import errors
from acceld.api.context import RequestContext

ADMIN = "role:admin"
PROJECT_MEMBER = "role:member and project_id:%(project_id)s"
PROJECT_READER = "role:reader and project_id:%(project_id)s"
PROJECT_MANAGER = "role:manager and project_id:%(project_id)s"
SERVICE = "role:service"

_base = [
    policy.RuleDefault("admin_api", ADMIN, "Administrators of the cloud."),
    policy.RuleDefault("project_member_api", PROJECT_MEMBER, "Members of the target project."),
    policy.RuleDefault("project_reader_api", PROJECT_READER, "Readers of the target project."),
    policy.RuleDefault("project_manager_api", PROJECT_MANAGER, "Managers of the target project."),
    policy.RuleDefault("service_api", SERVICE, "Other OpenStack services (Nova)."),
    policy.RuleDefault("project_reader_or_admin", "rule:project_reader_api or rule:admin_api",
                       "Readers of the project, or administrators."),
    policy.RuleDefault("project_member_or_service", "rule:project_member_api or rule:service_api",
                       "Members of the project, or services."),
    policy.RuleDefault("project_manager_or_admin", "rule:project_manager_api or rule:admin_api",
                       "Managers of the project, or administrators."),
]


def _op(name: str, check: str, method: str, path: str, description: str) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(name=name, check_str=check, description=description,
                                        operations=[{"method": method, "path": path}],
                                        scope_types=["project"])


_READER = "rule:project_reader_or_admin"
_MEMBER = "rule:project_member_or_service"
_MANAGER = "rule:project_manager_or_admin"
_ADMIN = "rule:admin_api"

RULES = _base + [
    _op("cyborg:arq:get_all", _READER, "GET", "/v2/accelerator_requests", "List ARQs."),
    _op("cyborg:arq:get_one", _READER, "GET", "/v2/accelerator_requests/{uuid}", "Show an ARQ."),
    _op("cyborg:arq:create", _MEMBER, "POST", "/v2/accelerator_requests", "Create ARQs."),
    _op("cyborg:arq:update", _MEMBER, "PATCH", "/v2/accelerator_requests",
        "Bind or unbind ARQs."),
    _op("cyborg:arq:delete", _MEMBER, "DELETE", "/v2/accelerator_requests", "Delete ARQs."),
    _op("cyborg:device_profile:get_all", _READER, "GET", "/v2/device_profiles",
        "List device profiles."),
    _op("cyborg:device_profile:get_one", _READER, "GET", "/v2/device_profiles/{uuid}",
        "Show a device profile."),
    _op("cyborg:device_profile:create", _ADMIN, "POST", "/v2/device_profiles",
        "Create a device profile."),
    _op("cyborg:device_profile:delete", _ADMIN, "DELETE", "/v2/device_profiles/{uuid}",
        "Delete device profiles."),
    _op("cyborg:device:get_all", _MANAGER, "GET", "/v2/devices", "List devices."),
    _op("cyborg:device:get_one", _MANAGER, "GET", "/v2/devices/{uuid}", "Show a device."),
    _op("cyborg:device:disable", _ADMIN, "POST", "/v2/devices/{uuid}/disable",
        "Disable a device."),
    _op("cyborg:device:enable", _ADMIN, "POST", "/v2/devices/{uuid}/enable",
        "Enable a device."),
    _op("cyborg:deployable:get_all", _MANAGER, "GET", "/v2/deployables", "List deployables."),
    _op("cyborg:deployable:get_one", _MANAGER, "GET", "/v2/deployables/{uuid}",
        "Show a deployable."),
    _op("cyborg:deployable:program", _ADMIN, "PATCH", "/v2/deployables/{uuid}/program",
        "Program a deployable."),
    _op("cyborg:attribute:get_all", _MANAGER, "GET", "/v2/attributes", "List attributes."),
    _op("cyborg:attribute:get_one", _MANAGER, "GET", "/v2/attributes/{uuid}",
        "Show an attribute."),
    _op("cyborg:attribute:create", _ADMIN, "POST", "/v2/attributes", "Create an attribute."),
    _op("cyborg:attribute:delete", _ADMIN, "DELETE", "/v2/attributes/{uuid}",
        "Delete an attribute."),
    _op("acceld:host:get_all", _ADMIN, "GET", "/v2/hosts", "List agents and their liveness."),
]


def list_rules() -> list[policy.RuleDefault]:
    """Entry point for oslopolicy-sample-generator and `acceld policy sample`."""
    return list(RULES)


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
        target = target if target is not None else {"project_id": ctx.project_id}
        if not self._allowed(rule, ctx, target):
            raise errors.Forbidden(f"Policy doesn't allow {rule} to be performed.")

    def _allowed(self, rule: str, ctx: RequestContext, target: dict) -> bool:
        now = time.monotonic()
        if now - self._loaded_at > self.RELOAD_SECONDS or len(self._decisions) > self.MAX_CACHED:
            self.enforcer.load_rules()
            self._decisions.clear()
            self._loaded_at = now
        key = (rule, ctx.user_id, ctx.project_id, tuple(ctx.roles), tuple(ctx.service_roles),
               tuple(sorted(target.items())))
        allowed = self._decisions.get(key)
        if allowed is None:
            try:
                allowed = bool(self.enforcer.authorize(rule, target, ctx.policy_credentials(),
                                                       do_raise=False))
            except policy.InvalidScope:
                allowed = False
            self._decisions[key] = allowed
        return allowed
