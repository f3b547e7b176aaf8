"""Ids a driver read from a function's host-side files (or NVML), kept across agent restarts.

An FPGA's AFU (function) id and PR interface id are read from files the host's FPGA
driver makes (``dfl-port.N/afu_id``, ``compat_id``). While the function is in a VM it is
bound to vfio-pci and those files are gone, so the last ids read are the only ones to
report: without them the deployable's ``CUSTOM_FPGA_FUNCTION_ID_*`` trait would vanish,
and Placement's traits change under the running instance. Kept in memory they survive
only until the agent restarts; this store also writes them to
``<state_path>/<driver>/remembered_ids.json``.

Each id is stored with the function's PCI ids (vendor, device, subsystem): a card
swapped into the same slot while the agent was down never inherits another card's ids.
A missing or unreadable file is an empty store (logged); writes are atomic (a temporary
file renamed over the old one) and happen only when something changed.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading

from acceld.drivers import sysfs

LOG = logging.getLogger(__name__)
FILE_NAME = "remembered_ids.json"


def _identity(function: sysfs.PciFunction) -> list[str | None]:
    return [function.vendor, function.device, function.subsystem_vendor,
            function.subsystem_device]


class RememberedIds:
    """``kind`` (e.g. ``afu_id``) -> PCI address -> {"id": ..., "pci": [vendor, ...]}."""

    def __init__(self, directory: str | None) -> None:
        """``directory`` None: kept in memory only (a run without a state_path)."""
        self.path = os.path.join(directory, FILE_NAME) if directory else None
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, dict[str, object]]] = self._load()

    def _load(self) -> dict[str, dict[str, dict[str, object]]]:
        if self.path is None:
            return {}
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            LOG.warning("%s is unreadable (%s): ids of functions now in VMs are unknown "
                        "until their host driver shows them again", self.path, exc)
            return {}
        if not isinstance(data, dict):
            return {}
        return {kind: entries for kind, entries in data.items() if isinstance(entries, dict)}

    def get(self, kind: str, function: sysfs.PciFunction) -> str | None:
        with self._lock:
            entry = self._data.get(kind, {}).get(function.address)
        if not isinstance(entry, dict) or entry.get("pci") != _identity(function):
            return None
        value = entry.get("id")
        return value if isinstance(value, str) and value else None

    def put(self, kind: str, function: sysfs.PciFunction, value: str) -> None:
        entry = {"id": value, "pci": _identity(function)}
        with self._lock:
            entries = self._data.setdefault(kind, {})
            if entries.get(function.address) == entry:
                return
            entries[function.address] = entry
            snapshot = json.dumps(self._data, indent=1, sort_keys=True)
        self._write(snapshot)

    def _write(self, text: str) -> None:
        if self.path is None:
            return
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".remembered_ids-")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            LOG.warning("could not keep ids in %s (%s): they last until the agent "
                        "restarts", self.path, exc)
