"""The driver interface: everything a vendor needs to write an acceld driver.

A driver finds one kind of hardware on a node and describes it as
:class:`HardwareRecord` objects. The node agent calls :meth:`Driver.discover`
(in process) or the driver's ``GET /hardware`` (an external driver process,
the seed's Driver API); both produce the same JSON, described by
``docs/hardware-record.schema.json``, and go through one reconciliation path
in the conductor.

Optional abilities, each refused with :class:`NotSupported` by default:

- :meth:`Driver.program`: write a bitstream (FPGA) or a firmware image.
- :meth:`Driver.prepare_attach_handle` / :meth:`Driver.release_attach_handle`:
  make an attach handle usable before a VM gets it (e.g. create a vGPU mdev)
  and undo that after unbind. The conductor calls them (through the node's
  agent) only for handles :func:`needs_attach_step` names; other handles cost
  no agent call on bind or unbind.

Names. A deployable's ``name`` from a driver is local to the node (a PCI
address, ``FakeDevice``); the inventory stores ``<hostname>_<name>``, which is
also the Placement provider name.
"""

from __future__ import annotations

import abc
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # annotations only: drivers stay importable with the standard library alone
    from oslo_config import cfg

# Device types the API shows (upstream's set).
DEVICE_TYPES = ("GPU", "FPGA", "AICHIP", "QAT", "NIC", "SSD")
# The seed's hardware states: only 'ready' hardware is offered as accelerators.
ACC_STATUSES = ("ready", "setup_required", "reboot_required")
ATTACH_TYPES = ("PCI", "MDEV", "TEST_PCI")
# Handles that exist on the host only once prepared: an MDEV is created on bind and removed
# after unbind. A handle whose attach_info carries one of HOST_STEP_INFO_KEYS needs the same
# (a vendor-specific VFIO vGPU: the VF gets its vGPU type on bind, 0 after unbind).
HOST_STEP_ATTACH_TYPES = frozenset({"MDEV"})
HOST_STEP_INFO_KEYS = frozenset({"vgpu_type"})
# Namespace for uuids derived from stable hardware identity.
HARDWARE_NAMESPACE = uuidlib.UUID("6c0bd3c2-3a33-4f0e-9d5c-2f7e0b1a9a41")


class NotSupported(Exception):
    """The driver cannot do what was asked (program, firmware, ...). Answered with a 4xx."""


class DriverError(Exception):
    """The driver tried and failed (tool exited non-zero, device busy, ...)."""


@dataclass
class AttachHandle:
    """What a VM is attached to. ``attach_info`` holds strings only (PCI address parts, mdev uuid)."""

    attach_type: str
    attach_info: dict[str, str]
    in_use: bool = False


@dataclass
class Deployable:
    """One offerable unit: a Placement provider with ``num_accelerators`` of resource class ``rc``."""

    name: str
    num_accelerators: int
    # 'rc' (resource class) and 'trait0'..'traitN'; more keys are kept as attributes too.
    attributes: dict[str, str]
    attach_handles: list[AttachHandle] = field(default_factory=list)
    bitstream_id: str | None = None


@dataclass
class HardwareRecord:
    """The seed's hardware item (uuid, acc_specs, acc_status) plus what the inventory needs."""

    uuid: str
    type: str
    vendor: str
    model: str
    driver_name: str
    controlpath_id: dict[str, Any]  # {"cpid_type": "PCI", "cpid_info": {domain, bus, ...}}
    acc_specs: dict[str, Any] = field(default_factory=dict)
    acc_status: str = "ready"
    status_reason: str | None = None
    std_board_info: dict[str, Any] = field(default_factory=dict)
    # A JSON object, or a plain string as upstream's fake driver reports ("fake_vendor_info").
    vendor_board_info: dict[str, Any] | str = field(default_factory=dict)
    deployables: list[Deployable] = field(default_factory=list)
    # acceld.drivers.health.Health.to_dict(), or None: the driver says nothing (unknown).
    health: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["health"] is None:
            del data["health"]  # records from drivers that report no health stay as they were
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HardwareRecord":
        """From JSON already validated against the hardware record schema.

        ``acc_status`` may also be the seed's object form
        (``{"setup_required": true, "reboot_required": false}``); it becomes one word.
        """
        deployables = [
            Deployable(name=d["name"], num_accelerators=d["num_accelerators"],
                       attributes=dict(d.get("attributes", {})),
                       attach_handles=[AttachHandle(**h) for h in d.get("attach_handles", [])],
                       bitstream_id=d.get("bitstream_id"))
            for d in data.get("deployables", [])
        ]
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["deployables"] = deployables
        fields["acc_status"] = normalize_acc_status(data.get("acc_status", "ready"))
        return cls(**fields)


def normalize_acc_status(value: str | dict[str, Any]) -> str:
    """The seed's ``{"setup_required": bool, "reboot_required": bool}`` as one of ACC_STATUSES.

    Setup comes first: hardware that needs setup cannot be used after a reboot either.
    The seed's own example misspells ``reboot_equired``; both spellings are read.
    """
    if isinstance(value, str):
        return value
    if value.get("setup_required"):
        return "setup_required"
    if value.get("reboot_required") or value.get("reboot_equired"):
        return "reboot_required"
    return "ready"


def needs_attach_step(attach_type: str, attach_info: dict[str, Any]) -> bool:
    """Whether binding must prepare this handle on its host, and unbinding release it.

    Decided from the handle alone, so that the API (which never talks to agents) and the
    conductor agree without asking the driver. PCI and TEST_PCI handles need no step
    unless their info names a host step (``vgpu_type``).
    """
    return attach_type in HOST_STEP_ATTACH_TYPES or not HOST_STEP_INFO_KEYS.isdisjoint(
        attach_info)


def hardware_uuid(hostname: str, driver_name: str, local_id: str) -> str:
    """A stable uuid for hardware: the same device on the same node keeps its uuid."""
    return str(uuidlib.uuid5(HARDWARE_NAMESPACE, f"{hostname}/{driver_name}/{local_id}"))


def pci_address_parts(address: str) -> dict[str, str]:
    """'0000:5e:00.1' -> {'domain': '0000', 'bus': '5e', 'device': '00', 'function': '1'}."""
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    return {"domain": domain, "bus": bus, "device": device, "function": function}


def pci_controlpath(address: str) -> dict[str, Any]:
    return {"cpid_type": "PCI", "cpid_info": pci_address_parts(address)}


def pci_handle(address: str) -> AttachHandle:
    return AttachHandle(attach_type="PCI", attach_info=pci_address_parts(address))


class Driver(abc.ABC):
    """Base class of every driver, in-tree or from another package.

    Register a driver as an entry point in the ``acceld.drivers`` group, e.g. in
    pyproject.toml: ``[project.entry-points."acceld.drivers"] mydrv = "mypkg:MyDriver"``.
    """

    #: The entry point name; also recorded as each deployable's ``driver_name``.
    name: ClassVar[str]
    #: The seed's hardware type, sent in ``POST /hello`` (e.g. "FPGA", "GPU", "CRYPTO").
    hardware_type: ClassVar[str]

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        self.conf = conf
        self.hostname = hostname

    @abc.abstractmethod
    def discover(self) -> list[HardwareRecord]:
        """Scan the node now and describe all hardware this driver handles."""

    def program(self, deployable_name: str, image_path: str, kind: str = "bitstream") -> None:
        """Write ``image_path`` to the deployable; ``kind`` is 'bitstream' or 'firmware'."""
        raise NotSupported(f"driver {self.name} cannot program {kind} images")

    def prepare_attach_handle(self, handle: AttachHandle) -> AttachHandle:
        """Make a handle usable before binding; return it, possibly with updated info."""
        return handle

    def release_attach_handle(self, handle: AttachHandle) -> None:
        """Undo prepare_attach_handle after unbind."""

    def prepared_attach_handles(self) -> list[AttachHandle]:
        """The host-step resources this driver made that exist on the host now (an mdev it
        created), each as the attach handle that names it, as discovery reports it.

        The agent reports them so that the conductor can release the ones no handle in use
        accounts for (orphans). Only resources the driver can tell are its own (a uuid only
        acceld derives, its own record): never one another tool created. Default: none."""
        return []
