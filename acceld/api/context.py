"""Who is calling: identity from the headers keystonemiddleware sets (or noauth defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from oslo_config import cfg

_SYSTEM_SCOPE = "OPENSTACK-SYSTEM-SCOPE"  # set by keystonemiddleware for system-scoped tokens


def _split(value: str | None) -> list[str]:
    if not value:
        return []
    return [part.strip().lower() for part in value.split(",") if part.strip()]


@dataclass(slots=True)
class RequestContext:
    user_id: str | None
    project_id: str | None
    roles: list[str] = field(default_factory=list)
    service_roles: list[str] = field(default_factory=list)
    request_id: str = ""
    # "all" for a system-scoped token (OpenStack-System-Scope): refused by every rule,
    # since upstream's rules are all project-scoped.
    system_scope: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def has_service_role(self, role: str) -> bool:
        return role.lower() in self.service_roles or role.lower() in self.roles

    def policy_credentials(self) -> dict:
        return {"user_id": self.user_id, "project_id": self.project_id, "roles": self.roles,
                "service_roles": self.service_roles, "system_scope": self.system_scope,
                "domain_id": None, "is_admin_project": True, "is_admin": self.is_admin}


class ContextFactory:
    """Builds a request's context. The few options it needs are read once, when the app is
    built: oslo.config attribute lookups cost about a microsecond each, on every request."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.noauth = conf.auth_strategy == "noauth"
        self.default_user_id = conf.api.noauth_user_id
        self.default_project_id = conf.api.noauth_project_id
        self.default_roles = tuple(r.lower() for r in conf.api.noauth_roles)
        self.default_service_roles = tuple(r.lower() for r in conf.api.noauth_service_roles)

    def build(self, get: Callable[[str], str | None], request_id: str) -> RequestContext:
        """In noauth mode a request with no identity header at all gets the configured
        defaults (an admin holding the service role in the all-in-one); explicit headers are
        always honoured. ``get`` returns a header's value or None."""
        user_id, project_id = get("X-USER-ID"), get("X-PROJECT-ID")
        roles, service_roles = get("X-ROLES"), get("X-SERVICE-ROLES")
        system_scope = get(_SYSTEM_SCOPE) or None
        if self.noauth:
            anonymous = not (user_id or project_id or roles or service_roles)
            return RequestContext(
                user_id=user_id or self.default_user_id,
                project_id=project_id or self.default_project_id,
                roles=_split(roles) if roles else list(self.default_roles),
                service_roles=list(self.default_service_roles) if anonymous
                else _split(service_roles),
                request_id=request_id, system_scope=system_scope)
        return RequestContext(user_id=user_id, project_id=project_id, roles=_split(roles),
                              service_roles=_split(service_roles), request_id=request_id,
                              system_scope=system_scope)


def from_headers(headers: dict[str, str], conf: cfg.ConfigOpts, request_id: str) -> RequestContext:
    """The context for a header mapping (upper-case names), reading ``conf`` now."""
    return ContextFactory(conf).build(headers.get, request_id)
