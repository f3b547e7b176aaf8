"""What API workers ask of the conductor over the internal API."""

from __future__ import annotations

import logging
import os
from typing import Any

import requests
from oslo_config import cfg

from acceld.clients.internal import InternalClient, InternalError, scheme, tls_verify
from acceld.internal.auth import CONDUCTOR
from acceld.services.secrets import SECRET_FILE, internal_secret

LOG = logging.getLogger(__name__)


def conductor_url(conf: cfg.ConfigOpts) -> str:
    return conf.conductor.url or (
        f"{scheme(conf)}://{conf.conductor.host_ip}:{conf.conductor.port}")


class ConductorClient:
    def __init__(self, url: str, secret: bytes, verify: str | bool = True) -> None:
        self._client = InternalClient(url, secret, timeout=30.0, verify=verify,
                                      destination=CONDUCTOR)

    def wake_binds(self) -> None:
        """Ask the conductor to look for bind jobs now. Best effort: it also polls."""
        try:
            self._client.call("POST", "/binds/wake", {}, timeout=2.0)
        except (requests.RequestException, InternalError) as exc:
            LOG.debug("Could not wake the conductor (it will poll): %s", exc)

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """A synchronous call (programming, ...); errors propagate to the caller."""
        return self._client.call(method, path, body, timeout=timeout)


def client_from_config(conf: cfg.ConfigOpts) -> ConductorClient | None:
    """The conductor client, or None when no internal secret is available to sign with."""
    if not conf.internal.shared_secret and not os.path.exists(
            os.path.join(conf.state_path, SECRET_FILE)):
        LOG.warning("No internal secret: the API will not call the conductor directly.")
        return None
    return ConductorClient(conductor_url(conf), internal_secret(conf),
                           verify=tls_verify(conf))
