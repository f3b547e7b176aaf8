"""This installation's acceld version, and how versions compare (upgrade checks).

Read from the installed distribution's metadata, so that an agent and a conductor
installed from different releases say which each is."""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version


def _installed() -> str:
    try:
        return metadata.version("acceld")
    except metadata.PackageNotFoundError:  # running from a source tree never installed
        return "0+unknown"


VERSION = _installed()


def is_older(version: str, than: str) -> bool:
    """Whether ``version`` is a release before ``than``; an unparsable one counts as
    older (it cannot be shown to be as new)."""
    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return True
