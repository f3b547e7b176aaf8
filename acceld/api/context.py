"""Who is calling: identity from the headers keystonemiddleware sets (or noauth defaults).

The policy credentials are those oslo.context's ``to_policy_values`` gives, so operator
rules written for other OpenStack services (``domain_id``, ``system_scope``,
``is_admin_project``, ``service_roles``, ...) mean the same here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from oslo_config import cfg
from oslo_context import context as oslo_context

_SYSTEM_SCOPE = "OPENSTACK-SYSTEM-SCOPE"  # set by keystonemiddleware for system-scoped tokens


def _split(value: str | None) -> list[str]:
    if not value:
        return []
    return [part.strip().lower() for part in value.split(",") if part.strip()]


def _flag(value: str | None) -> bool:
    """X-Is-Admin-Project: keystonemiddleware writes 'True' or 'False'; absent means True,
    as oslo.context reads it (Keystone without an admin project configured)."""
    return value is None or value.strip().lower() != "false"


@dataclass(slots=True)
class RequestContext:
    user_id: str | None
    project_id: str | None
    roles: list[str] = field(default_factory=list)
    # Roles of the X-Service-Token (Nova's), never of the user's own token.
    service_roles: list[str] = field(default_factory=list)
    request_id: str = ""
    # The caller's X-OpenStack-Request-Id (validated), passed on to the services this
    # request leads to; None when the caller sent none (this request's id goes on then).
    global_request_id: str | None = None
    # "all" for a system-scoped token (OpenStack-System-Scope).
    system_scope: str | None = None
    # The domain of a domain-scoped token (X-Domain-Id); None for project-scoped tokens.
    domain_id: str | None = None
    user_domain_id: str | None = None
    project_domain_id: str | None = None
    is_admin_project: bool = True
    # Who the service token (X-Service-Token) belongs to, for operator rules that name it.
    service_user_id: str | None = None
    service_user_domain_id: str | None = None
    service_project_id: str | None = None
    service_project_domain_id: str | None = None
    # Why the X-Service-Token's roles were set aside (its own user's, or not the service
    # project's), for the refusal an operation that needs them gives; None otherwise.
    service_token_refused: str | None = None

    @property
    def global_id(self) -> str:
        """The id to pass on to other services (oslo.context's ``global_id``)."""
        return self.global_request_id or self.request_id

    def log_context(self) -> oslo_context.RequestContext:
        """This context as oslo.context's, which oslo.log's formatter reads for each line:
        both request ids, user, project and domains."""
        return oslo_context.RequestContext(
            request_id=self.request_id, global_request_id=self.global_request_id,
            user_id=self.user_id, project_id=self.project_id, domain_id=self.domain_id,
            user_domain_id=self.user_domain_id, project_domain_id=self.project_domain_id,
            system_scope=self.system_scope, roles=list(self.roles), overwrite=False)

    @property
    def scope(self) -> str:
        """What the token is scoped to, as oslo.policy decides it: system, domain or project
        ("unscoped" when it names none of them)."""
        if self.system_scope:
            return "system"
        if self.domain_id:
            return "domain"
        return "project" if self.project_id else "unscoped"

    @property
    def is_admin(self) -> bool:
        """An administrator of the cloud: the admin role on a project-scoped token. An admin
        of a domain (or of the system) is not one: such tokens see no project data."""
        return "admin" in self.roles and self.scope == "project"

    def has_service_role(self, role: str) -> bool:
        """Only the service token (X-Service-Roles) proves a service: a user who holds the
        role on their own token is still a user, as keystonemiddleware and upstream see it."""
        return role.lower() in self.service_roles

    def policy_credentials(self) -> dict:
        return {"user_id": self.user_id, "user_domain_id": self.user_domain_id,
                "project_id": self.project_id, "project_domain_id": self.project_domain_id,
                "domain_id": self.domain_id, "system_scope": self.system_scope,
                "roles": self.roles, "service_roles": self.service_roles,
                "is_admin_project": self.is_admin_project, "is_admin": self.is_admin,
                "service_user_id": self.service_user_id,
                "service_user_domain_id": self.service_user_domain_id,
                "service_project_id": self.service_project_id,
                "service_project_domain_id": self.service_project_domain_id}

    def cache_key(self) -> tuple:
        """Everything a policy decision can depend on about the caller."""
        return (self.user_id, self.user_domain_id, self.project_id, self.project_domain_id,
                self.domain_id, self.system_scope, self.is_admin_project, tuple(self.roles),
                tuple(self.service_roles), self.service_user_id, self.service_user_domain_id,
                self.service_project_id, self.service_project_domain_id)


class ContextFactory:
    """Builds a request's context. The few options it needs are read once, when the app is
    built: oslo.config attribute lookups cost about a microsecond each, on every request."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.noauth = conf.auth_strategy == "noauth"
        self.default_user_id = conf.api.noauth_user_id
        self.default_project_id = conf.api.noauth_project_id
        self.default_roles = tuple(r.lower() for r in conf.api.noauth_roles)
        self.default_service_roles = tuple(r.lower() for r in conf.api.noauth_service_roles)
        self.service_project = conf.api.service_token_project or None
        self.service_project_domain = conf.api.service_token_project_domain

    def _service_token_refusal(self, get: Callable[[str], str | None], user_id: str | None,
                               service_user_id: str | None) -> str | None:
        """Why the service token must not count, or None when it may.

        keystonemiddleware's ``service_token_roles`` check only asks for the role: a user who
        holds it could send their own token as both tokens and pass for Nova. The service
        token must therefore be another user's, and (``[api] service_token_project``) a user
        of the service project's. noauth trusts its headers: a fact it is not given is not
        checked; keystonemiddleware always gives them."""
        if service_user_id is None:
            if self.noauth:
                return None
            return "The X-Service-Token names no user."
        if service_user_id == user_id:
            return ("The X-Service-Token belongs to the same user as the X-Auth-Token; a "
                    "service token counts only when it is another user's (the service's).")
        if self.service_project is None:
            return None
        project_id, project_name = get("X-SERVICE-PROJECT-ID"), get("X-SERVICE-PROJECT-NAME")
        if self.noauth and not (project_id or project_name):
            return None
        if project_id == self.service_project:
            return None
        if project_name == self.service_project and self.service_project_domain in (
                get("X-SERVICE-PROJECT-DOMAIN-NAME"), get("X-SERVICE-PROJECT-DOMAIN-ID")):
            return None
        return (f"The X-Service-Token's user is not scoped to the service project "
                f"({self.service_project!r}, [api] service_token_project).")

    def build(self, get: Callable[[str], str | None], request_id: str,
              global_request_id: str | None = None) -> RequestContext:
        """In noauth mode a request with no identity header at all gets the configured
        defaults (an admin holding the service role in the all-in-one); explicit headers are
        always honoured, and a request that names a domain or the system scope is never
        given the default project. ``get`` returns a header's value or None."""
        user_id, project_id = get("X-USER-ID"), get("X-PROJECT-ID")
        roles, service_roles = get("X-ROLES"), get("X-SERVICE-ROLES")
        system_scope = get(_SYSTEM_SCOPE) or None
        domain_id = get("X-DOMAIN-ID") or None
        identity = dict(request_id=request_id, global_request_id=global_request_id,
                        system_scope=system_scope, domain_id=domain_id,
                        user_domain_id=get("X-USER-DOMAIN-ID") or None,
                        project_domain_id=get("X-PROJECT-DOMAIN-ID") or None,
                        is_admin_project=_flag(get("X-IS-ADMIN-PROJECT")),
                        service_user_id=get("X-SERVICE-USER-ID") or None,
                        service_user_domain_id=get("X-SERVICE-USER-DOMAIN-ID") or None,
                        service_project_id=get("X-SERVICE-PROJECT-ID") or None,
                        service_project_domain_id=get("X-SERVICE-PROJECT-DOMAIN-ID") or None)
        if self.noauth:
            anonymous = not (user_id or project_id or roles or service_roles)
            scoped_elsewhere = bool(system_scope or domain_id)
            ctx = RequestContext(
                user_id=user_id or self.default_user_id,
                project_id=project_id or (None if scoped_elsewhere else self.default_project_id),
                roles=_split(roles) if roles else list(self.default_roles),
                service_roles=list(self.default_service_roles) if anonymous
                else _split(service_roles), **identity)
        else:
            ctx = RequestContext(user_id=user_id, project_id=project_id or None,
                                 roles=_split(roles), service_roles=_split(service_roles),
                                 **identity)
        if ctx.service_roles:
            refused = self._service_token_refusal(get, ctx.user_id, ctx.service_user_id)
            if refused is not None:
                ctx.service_roles = []
                ctx.service_token_refused = refused
        return ctx


def from_headers(headers: dict[str, str], conf: cfg.ConfigOpts, request_id: str) -> RequestContext:
    """The context for a header mapping (upper-case names), reading ``conf`` now."""
    return ContextFactory(conf).build(headers.get, request_id)
