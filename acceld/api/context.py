"""Who is calling: identity from the headers keystonemiddleware sets (or noauth defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from oslo_config import cfg

_IDENTITY_HEADERS = ("X-USER-ID", "X-PROJECT-ID", "X-ROLES", "X-SERVICE-ROLES")
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


def from_headers(headers: dict[str, str], conf: cfg.ConfigOpts, request_id: str) -> RequestContext:
    """Build the context. In noauth mode a request with no identity header at all gets the
    configured defaults (an admin holding the service role in the all-in-one); explicit
    headers are always honoured."""
    get = headers.get
    if conf.auth_strategy == "noauth":
        anonymous = not any(get(h) for h in _IDENTITY_HEADERS)
        return RequestContext(
            user_id=get("X-USER-ID") or conf.api.noauth_user_id,
            project_id=get("X-PROJECT-ID") or conf.api.noauth_project_id,
            roles=_split(get("X-ROLES")) if get("X-ROLES") else
            [r.lower() for r in conf.api.noauth_roles],
            service_roles=[r.lower() for r in conf.api.noauth_service_roles] if anonymous
            else _split(get("X-SERVICE-ROLES")),
            request_id=request_id, system_scope=get(_SYSTEM_SCOPE) or None)
    return RequestContext(user_id=get("X-USER-ID"), project_id=get("X-PROJECT-ID"),
                          roles=_split(get("X-ROLES")),
                          service_roles=_split(get("X-SERVICE-ROLES")),
                          request_id=request_id, system_scope=get(_SYSTEM_SCOPE) or None)
