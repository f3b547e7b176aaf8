"""Internal keys: the cloud's secret (controllers) and a node's own key (agents, drivers).

The cloud's secret is ``[internal] shared_secret``, or generated once under the
state path (``internal.secret``, mode 0600, in a 0700 directory). A node's key
is ``[internal] node_key`` / ``node_key_file``, else derived from the cloud's
secret where the machine has it (the all-in-one, at generation 0). A configured key
printed for generation N > 0 reads ``g<N>:<hex>`` (acceld.internal.auth.parse_node_key):
the node signs with that generation. Secrets and keys shorter than
:data:`acceld.internal.auth.MIN_SECRET_LENGTH` are refused at start.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from typing import TYPE_CHECKING

from oslo_config import cfg

from acceld.internal.auth import (MIN_SECRET_LENGTH, CloudKeys, NodeKey, node_key,
                                  parse_node_key)

if TYPE_CHECKING:
    from acceld.db.engine import Database

LOG = logging.getLogger(__name__)

SECRET_FILE = "internal.secret"


def ensure_state_dir(state_path: str) -> str:
    """Create the state directory private to its owner (0700); warn if an existing one is not."""
    if not os.path.isdir(state_path):
        os.makedirs(state_path, mode=0o700, exist_ok=True)
        os.chmod(state_path, 0o700)  # makedirs' mode is masked by the umask
    elif os.stat(state_path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        # Worded without "secret:" so the log redaction leaves the advice readable.
        LOG.warning("State directory %s is open to other users (mode %o) and holds the "
                    "internal secret file; run chmod 700 on it", state_path,
                    os.stat(state_path).st_mode & 0o777)
    return state_path


def ensure_secret_file(state_path: str) -> str:
    """Create the secret file if missing (0600, in a 0700 state directory); return its path."""
    ensure_state_dir(state_path)
    path = os.path.join(state_path, SECRET_FILE)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path


def _checked(value: str, what: str) -> bytes:
    if len(value) < MIN_SECRET_LENGTH:
        raise SystemExit(f"{what} is {len(value)} characters long; at least "
                         f"{MIN_SECRET_LENGTH} are required (generate one with "
                         "`python3 -c 'import secrets; print(secrets.token_urlsafe(48))'`).")
    return value.encode()


def has_cloud_secret(conf: cfg.ConfigOpts) -> bool:
    return bool(conf.internal.shared_secret) or os.path.exists(
        os.path.join(conf.state_path, SECRET_FILE))


def internal_secret(conf: cfg.ConfigOpts) -> bytes:
    """The cloud's secret (controllers sign with it and derive node keys from it)."""
    if conf.internal.shared_secret:
        return _checked(conf.internal.shared_secret, "[internal] shared_secret")
    path = os.path.join(conf.state_path, SECRET_FILE)
    try:
        with open(path) as handle:
            return _checked(handle.read().strip(), path)
    except FileNotFoundError:
        raise SystemExit(f"No [internal] shared_secret configured and no {path}; "
                         "set one, or run `acceld all` once to generate it.") from None


def own_node_key(conf: cfg.ConfigOpts, hostname: str) -> NodeKey:
    """This node's key and its generation: configured, from its file, or derived from the
    cloud's secret (generation 0)."""
    if conf.internal.node_key:
        return parse_node_key(_checked(conf.internal.node_key,
                                       "[internal] node_key").decode())
    if conf.internal.node_key_file:
        path = conf.internal.node_key_file
        try:
            with open(path) as handle:
                if os.fstat(handle.fileno()).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                    LOG.warning("Node key file %s is readable by other users: chmod 600 it",
                                path)
                return parse_node_key(_checked(handle.read().strip(), path).decode())
        except OSError as exc:
            raise SystemExit(f"Cannot read [internal] node_key_file: {exc}") from None
    if has_cloud_secret(conf):
        return NodeKey(node_key(internal_secret(conf), hostname))
    raise SystemExit(f"No key for node {hostname}: set [internal] node_key to the output of "
                     f"`acceld internal node-key {hostname}` on a controller.")


def cloud_keyring(conf: cfg.ConfigOpts, db: "Database | None" = None) -> CloudKeys:
    """What the conductor accepts: the cloud's secret, and every node's derived key at the
    generation ``db``'s node_key_generations says is current (no ``db``: generation 0)."""
    generations = None
    if db is not None:
        from acceld.db import node_keys

        generations = node_keys.generations(db, conf.internal.credential_ttl)
    return CloudKeys(internal_secret(conf), generations)
