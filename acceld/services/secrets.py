"""The internal shared secret: configured, or generated once under the state path (0600)."""

from __future__ import annotations

import os
import secrets

from oslo_config import cfg

SECRET_FILE = "internal.secret"


def ensure_secret_file(state_path: str) -> str:
    """Create the secret file if missing; return its path."""
    os.makedirs(state_path, exist_ok=True)
    path = os.path.join(state_path, SECRET_FILE)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path


def internal_secret(conf: cfg.ConfigOpts) -> bytes:
    """The secret internal calls are signed with."""
    if conf.internal.shared_secret:
        return conf.internal.shared_secret.encode()
    path = os.path.join(conf.state_path, SECRET_FILE)
    try:
        with open(path) as handle:
            return handle.read().strip().encode()
    except FileNotFoundError:
        raise SystemExit(f"No [internal] shared_secret configured and no {path}; "
                         "set one, or run `acceld all` once to generate it.") from None
