"""Small helpers the API tests share."""

from __future__ import annotations

import json

ADMIN = {"X-User-Id": "admin-user", "X-Project-Id": "admin-project",
         "X-Roles": "admin,member,reader,manager"}
SERVICE = {**ADMIN, "X-Service-Roles": "service"}


def member(project: str = "project-a") -> dict[str, str]:
    return {"X-User-Id": f"user-{project}", "X-Project-Id": project, "X-Roles": "member,reader"}


def version(v: str) -> dict[str, str]:
    return {"OpenStack-API-Version": f"accelerator {v}"}


def fault(result) -> str:  # type: ignore[no-untyped-def]
    """The faultstring of an upstream-shaped error body."""
    inner = json.loads(result.json["error_message"])
    return inner["faultstring"]
