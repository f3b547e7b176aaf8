"""Builders for fixture sysfs trees shaped like the real kernel's.

A :class:`SysfsTree` writes, under a temporary directory playing ``/sys``,
the same files and symlinks a real node has (see
``shared/reference/hardware-layouts.md``): the real device directory nested
under its bridge in ``devices/``, the ``bus/pci/devices/<bdf>`` link to it,
``driver`` and ``iommu_group`` links, ``physfn``/``virtfnN`` links for
SR-IOV, ``mdev_supported_types``, the NVIDIA vendor-specific VFIO directory,
OPAE/DFL FPGA regions, NVMe controllers and netdevs. Values are written as the
kernel prints them (``0x%04x`` ids, trailing newline, padded NVMe strings).
"""

from __future__ import annotations

import os
from pathlib import Path


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if value.endswith("\n") or value == "" else value + "\n")


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as the kernel makes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


class SysfsTree:
    """A fixture ``/sys`` at ``root`` (pass ``str(tree.root)`` as the driver's sysfs_root)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)

    # --- generic PCI -----------------------------------------------------------

    def device_dir(self, address: str) -> Path:
        """The real directory of a function (resolving the bus link)."""
        return (self.root / "bus" / "pci" / "devices" / address).resolve()

    def _parent_dir(self, address: str, bridge: str | Path | None) -> Path:
        """Where a function's directory lives: under its bridge's real directory when the
        bridge is a function of the tree, else under ``devices/pci<dom>:<bus>`` (the bridge's
        bus when a bridge address is named, as the kernel nests a device below its port)."""
        if isinstance(bridge, Path):
            return bridge
        domain = address[:4]
        if not bridge:
            return self.root / "devices" / f"pci{domain}:{address[5:7]}"
        bridge_link = self.root / "bus" / "pci" / "devices" / bridge
        if bridge_link.is_symlink():
            return bridge_link.resolve()
        first = bridge.split("/")[0]
        bus = first[5:7] if len(first) == 12 and first[4] == ":" else address[5:7]
        return self.root / "devices" / f"pci{domain}:{bus}" / bridge

    def add_pci(self, address: str, vendor: str, device: str, class_code: str, *,
                driver: str | None = None, subsystem_vendor: str | None = None,
                subsystem_device: str = "0x0000", revision: str = "0x00",
                numa_node: int = 0, iommu_group: int | None = None,
                bridge: str | Path | None = None) -> Path:
        """One PCI function: ``devices/pci<dom>:<bus>/<bridge>/<bdf>`` and its bus link."""
        parent = self._parent_dir(address, bridge)
        path = parent / address
        path.mkdir(parents=True, exist_ok=True)
        dev = device[2:] if device.startswith("0x") else device
        ven = vendor[2:] if vendor.startswith("0x") else vendor
        cls = int(class_code, 16)
        _write(path / "vendor", f"0x{ven}")
        _write(path / "device", f"0x{dev}")
        _write(path / "class", f"0x{cls:06x}")
        _write(path / "subsystem_vendor", subsystem_vendor or f"0x{ven}")
        _write(path / "subsystem_device", subsystem_device)
        _write(path / "revision", revision)
        _write(path / "numa_node", str(numa_node))
        _write(path / "enable", "1")
        _write(path / "driver_override", "(null)")
        _write(path / "modalias", f"pci:v0000{ven.upper()}d0000{dev.upper()}"
                                  f"sv0000{ven.upper()}sd00000000bc{cls >> 16:02X}"
                                  f"sc{(cls >> 8) & 0xff:02X}i{cls & 0xff:02X}")
        _write(path / "uevent", "\n".join([
            *( [f"DRIVER={driver}"] if driver else []),
            f"PCI_CLASS={cls:X}", f"PCI_ID={ven.upper()}:{dev.upper()}",
            f"PCI_SLOT_NAME={address}"]))
        _link(path / "subsystem", self.root / "bus" / "pci")
        _link(self.root / "bus" / "pci" / "devices" / address, path)
        if driver:
            self.bind(address, driver)
        if iommu_group is not None:
            group = self.root / "kernel" / "iommu_groups" / str(iommu_group)
            (group / "devices").mkdir(parents=True, exist_ok=True)
            _link(path / "iommu_group", group)
            _link(group / "devices" / address, path)
        return path

    def bind(self, address: str, driver: str) -> None:
        path = self.device_dir(address)
        drv = self.root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        _link(path / "driver", drv)
        _link(drv / address, path)

    def add_vfs(self, pf: str, vfs: list[str], vf_device: str, *, driver: str | None = None,
                total: int | None = None, iommu_base: int | None = None) -> list[Path]:
        """Enable SR-IOV on ``pf``: sriov_* files, virtfnN links, and each VF with physfn."""
        pf_path = self.device_dir(pf)
        vendor = (pf_path / "vendor").read_text().strip()
        class_code = (pf_path / "class").read_text().strip()
        numa = int((pf_path / "numa_node").read_text())
        self.set_sriov(pf, total=total if total is not None else max(len(vfs), 1),
                       numvfs=len(vfs), vf_device=vf_device)
        paths = []
        for index, vf in enumerate(vfs):
            vf_path = self.add_pci(vf, vendor, vf_device, class_code, driver=driver,
                                   numa_node=numa,
                                   iommu_group=None if iommu_base is None else iommu_base + index,
                                   bridge=pf_path.parent)  # VFs sit beside their PF
            _link(vf_path / "physfn", pf_path)
            _link(pf_path / f"virtfn{index}", vf_path)
            paths.append(vf_path)
        return paths

    def set_sriov(self, pf: str, *, total: int, numvfs: int = 0, vf_device: str = "0000") -> None:
        path = self.device_dir(pf)
        _write(path / "sriov_totalvfs", str(total))
        _write(path / "sriov_numvfs", str(numvfs))
        _write(path / "sriov_offset", "16")
        _write(path / "sriov_stride", "1")
        _write(path / "sriov_drivers_autoprobe", "1")
        _write(path / "sriov_vf_device", vf_device[2:] if vf_device.startswith("0x") else vf_device)

    # --- PCIe health (AER counters, link training) -------------------------------

    def set_aer(self, address: str, *, fatal: int = 0, nonfatal: int = 0,
                correctable: int = 0) -> None:
        """``aer_dev_{fatal,nonfatal,correctable}`` as the kernel prints them: one
        ``<Name> <count>`` line per error bit (the count put on one of them) and a total."""
        path = self.device_dir(address)
        uncorrectable = ["Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                         "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                         "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                         "PoisonTLPBlocked"]
        correct = ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                   "CorrIntErr", "HeaderOF"]
        for name, bits, hit, count, total in (
                ("aer_dev_fatal", uncorrectable, "DLP", fatal, "TOTAL_ERR_FATAL"),
                ("aer_dev_nonfatal", uncorrectable, "CmpltTO", nonfatal, "TOTAL_ERR_NONFATAL"),
                ("aer_dev_correctable", correct, "BadTLP", correctable, "TOTAL_ERR_COR")):
            lines = [f"{bit} {count if bit == hit else 0}" for bit in bits]
            _write(path / name, "\n".join(lines + [f"{total} {count}"]))

    def set_link(self, address: str, *, speed: str = "16.0 GT/s PCIe",
                 max_speed: str = "16.0 GT/s PCIe", width: int = 16, max_width: int = 16) -> None:
        """``current_link_speed``/``max_link_speed``/``*_link_width`` of a function."""
        path = self.device_dir(address)
        _write(path / "current_link_speed", speed)
        _write(path / "max_link_speed", max_speed)
        _write(path / "current_link_width", str(width))
        _write(path / "max_link_width", str(max_width))

    def add_root_port(self, address: str, *, max_speed: str = "16.0 GT/s PCIe",
                      max_width: int = 16) -> Path:
        """A PCIe root port (bridge, driver pcieport) that ``add_pci(bridge=address)`` nests
        devices under."""
        path = self.add_pci(address, "0x8086", "0x347a", "0x060400", driver="pcieport")
        _write(path / "max_link_speed", max_speed)
        _write(path / "max_link_width", str(max_width))
        return path

    # --- mdev (vGPU) -----------------------------------------------------------

    def add_mdev_type(self, parent: str, type_id: str, name: str | None, available: int, *,
                      device_api: str = "vfio-pci", description: str | None = None) -> Path:
        path = self.device_dir(parent) / "mdev_supported_types" / type_id
        (path / "devices").mkdir(parents=True, exist_ok=True)
        if name is not None:
            _write(path / "name", name)
        _write(path / "available_instances", str(available))
        _write(path / "device_api", device_api)
        if description is not None:
            _write(path / "description", description)
        _write(path / "create", "")
        mdev_bus = self.root / "class" / "mdev_bus"
        mdev_bus.mkdir(parents=True, exist_ok=True)
        _link(mdev_bus / parent, self.device_dir(parent))
        return path

    def add_mdev(self, parent: str, type_id: str, uuid: str) -> Path:
        """A created mdev: ``<parent>/<uuid>`` with mdev_type and remove, and its bus links."""
        parent_path = self.device_dir(parent)
        type_path = parent_path / "mdev_supported_types" / type_id
        path = parent_path / uuid
        path.mkdir(parents=True, exist_ok=True)
        _link(path / "mdev_type", type_path)
        _write(path / "remove", "")
        _link(type_path / "devices" / uuid, path)
        _link(self.root / "bus" / "mdev" / "devices" / uuid, path)
        return path

    def add_nvidia_vfio(self, vf: str, creatable: dict[int, str], current: int = 0) -> Path:
        """vGPU 17+ vendor-specific VFIO: ``<vf>/nvidia/{creatable,current}_vgpu_type(s)``."""
        path = self.device_dir(vf) / "nvidia"
        lines = ["ID    : vGPU Name"] + [f"{tid:<5d} : {name}" for tid, name in creatable.items()]
        _write(path / "creatable_vgpu_types", "\n".join(lines))
        _write(path / "current_vgpu_type", str(current))
        return path

    def add_module_version(self, module: str, version: str) -> None:
        _write(self.root / "module" / module / "version", version)

    # --- netdev ----------------------------------------------------------------

    def add_netdev(self, address: str, ifname: str) -> Path:
        dev = self.device_dir(address)
        path = dev / "net" / ifname
        path.mkdir(parents=True, exist_ok=True)
        _link(path / "device", dev)
        _write(path / "address", "3c:fd:fe:00:00:01")
        _link(self.root / "class" / "net" / ifname, path)
        return path

    # --- Intel FPGA ------------------------------------------------------------

    def add_dfl_pf(self, address: str, *, region: int, fme: int, port: int | None,
                   bitstream_id: str, interface_id: str, afu_id: str | None,
                   ports_num: int = 1) -> Path:
        """Upstream DFL: ``<pf>/fpga_region/regionN/{dfl-fme.M, dfl-port.K}``."""
        dev = self.device_dir(address)
        region_path = dev / "fpga_region" / f"region{region}"
        fme_path = region_path / f"dfl-fme.{fme}"
        _write(fme_path / "bitstream_id", bitstream_id)
        _write(fme_path / "bitstream_metadata", "0x0")
        _write(fme_path / "ports_num", str(ports_num))
        _write(fme_path / "socket_id", "0")
        pr = fme_path / f"dfl-fme-region.{fme + 1}" / "fpga_region" / f"region{region + 1}"
        _write(pr / "compat_id", interface_id)
        if port is not None:
            self._dfl_port(region_path, port, afu_id)
        _link(self.root / "class" / "fpga_region" / f"region{region}", region_path)
        return region_path

    def add_dfl_vf(self, address: str, *, region: int, port: int, afu_id: str | None) -> Path:
        region_path = self.device_dir(address) / "fpga_region" / f"region{region}"
        self._dfl_port(region_path, port, afu_id)
        _link(self.root / "class" / "fpga_region" / f"region{region}", region_path)
        return region_path

    def set_fpga_errors(self, feature_dir: Path, **registers: int) -> None:
        """Error registers under an FME or port directory's ``errors/`` (hex, as the DFL
        and legacy drivers print them): ``catfatal_errors=0x1``, ``errors=0x4`` (a port)."""
        for name, value in registers.items():
            _write(feature_dir / "errors" / name, f"0x{value:x}")

    def _dfl_port(self, region_path: Path, port: int, afu_id: str | None) -> None:
        port_path = region_path / f"dfl-port.{port}"
        _write(port_path / "id", str(port))
        _write(port_path / "power_state", "0")
        if afu_id is not None:
            _write(port_path / "afu_id", afu_id)

    def add_intel_fpga_legacy(self, address: str, *, dev: int, fme: int | None,
                              port: int | None, bitstream_id: str | None = None,
                              interface_id: str | None = None,
                              afu_id: str | None = None) -> Path:
        """The out-of-tree OPAE driver: ``<pf>/fpga/intel-fpga-dev.N/intel-fpga-{fme,port}.M``."""
        path = self.device_dir(address) / "fpga" / f"intel-fpga-dev.{dev}"
        path.mkdir(parents=True, exist_ok=True)
        _link(path / "device", self.device_dir(address))
        if fme is not None:
            fme_path = path / f"intel-fpga-fme.{fme}"
            _write(fme_path / "bitstream_id", bitstream_id or "0x0")
            _write(fme_path / "ports_num", "1")
            _write(fme_path / "pr" / "interface_id", interface_id or "")
        if port is not None:
            port_path = path / f"intel-fpga-port.{port}"
            _write(port_path / "id", str(port))
            if afu_id is not None:
                _write(port_path / "afu_id", afu_id)
        _link(self.root / "class" / "fpga" / f"intel-fpga-dev.{dev}", path)
        return path

    # --- QAT -------------------------------------------------------------------

    def add_qat_config(self, address: str, *, state: str = "up", services: str = "sym;asym",
                       num_rps: int = 64) -> Path:
        path = self.device_dir(address) / "qat"
        _write(path / "state", state)
        _write(path / "cfg_services", services)
        _write(path / "num_rps", str(num_rps))
        _write(path / "pm_idle_enabled", "1")
        return path

    # --- NVMe ------------------------------------------------------------------

    def add_nvme(self, address: str, ctrl: int, *, model: str, serial: str,
                 firmware: str = "2B2QEXM7", transport: str = "pcie", state: str = "live",
                 namespaces: tuple[int, ...] = (1,), holders: dict[str, list[str]] | None = None
                 ) -> Path:
        """``<pci>/nvme/nvmeN`` with space-padded model/serial, namespaces and block links."""
        dev = self.device_dir(address)
        path = dev / "nvme" / f"nvme{ctrl}"
        path.mkdir(parents=True, exist_ok=True)
        _link(path / "device", dev)
        _write(path / "model", model.ljust(40))
        _write(path / "serial", serial.ljust(20))
        _write(path / "firmware_rev", firmware.ljust(8))
        _write(path / "address", address if transport == "pcie"
               else "traddr=192.0.2.10,trsvcid=4420")
        _write(path / "transport", transport)
        _write(path / "state", state)
        _write(path / "cntlid", "1")
        _write(path / "subsysnqn", f"nqn.2014.08.org.nvmexpress:144d144d{serial}  {model}")
        for nsid in namespaces:
            name = f"nvme{ctrl}n{nsid}"
            ns = path / name
            _write(ns / "nsid", str(nsid))
            _write(ns / "size", "1953525168")
            _write(ns / "dev", self._next_dev())
            (ns / "holders").mkdir(parents=True, exist_ok=True)
            for holder in (holders or {}).get(name, []):
                (ns / "holders" / holder).mkdir(parents=True, exist_ok=True)
            _link(self.root / "block" / name, ns)
        _link(self.root / "class" / "nvme" / f"nvme{ctrl}", path)
        return path

    def add_nvme_partition(self, ctrl: int, nsid: int, part: int, *,
                           holders: tuple[str, ...] = ()) -> Path:
        ns = self.root / "class" / "nvme" / f"nvme{ctrl}"
        ns_path = ns.resolve() / f"nvme{ctrl}n{nsid}"
        return self._partition(ns_path, part, holders)

    def _partition(self, disk: Path, part: int, holders: tuple[str, ...]) -> Path:
        path = disk / f"{disk.name}p{part}"
        _write(path / "partition", str(part))
        _write(path / "dev", self._next_dev())
        (path / "holders").mkdir(parents=True, exist_ok=True)
        for holder in holders:
            (path / "holders" / holder).mkdir(parents=True, exist_ok=True)
        _link(self.root / "class" / "block" / path.name, path)
        return path

    def _next_dev(self) -> str:
        """A fresh block ``major:minor`` (259 is the kernel's extended dev major of NVMe)."""
        self._minor = getattr(self, "_minor", -1) + 1
        return f"259:{self._minor}"

    def add_nvme_multipath(self, subsys: int, controllers: list[int], *, nsid: int = 1,
                           partitions: tuple[int, ...] = ()) -> Path:
        """Native NVMe multipath (nvme_core.multipath=Y): each controller (already added
        with ``add_nvme(..., namespaces=())``) holds a hidden path ``nvme<S>c<C>n<N>``; the
        disk the host uses is the head ``devices/virtual/nvme-subsystem/nvme-subsys<S>/
        nvme<S>n<N>`` (``/sys/block`` links to it), with its partitions."""
        sub = self.root / "devices" / "virtual" / "nvme-subsystem" / f"nvme-subsys{subsys}"
        sub.mkdir(parents=True, exist_ok=True)
        _write(sub / "iopolicy", "numa")
        _link(self.root / "class" / "nvme-subsystem" / f"nvme-subsys{subsys}", sub)
        head = sub / f"nvme{subsys}n{nsid}"
        _write(head / "nsid", str(nsid))
        _write(head / "dev", self._next_dev())
        (head / "holders").mkdir(parents=True, exist_ok=True)
        for ctrl in controllers:
            ctrl_path = (self.root / "class" / "nvme" / f"nvme{ctrl}").resolve()
            _link(sub / f"nvme{ctrl}", ctrl_path)
            hidden = ctrl_path / f"nvme{subsys}c{ctrl}n{nsid}"
            _write(hidden / "nsid", str(nsid))
            _link(head / "multipath" / hidden.name, hidden)
        _link(self.root / "block" / head.name, head)
        for part in partitions:
            self._partition(head, part, ())
        return head

    def add_btrfs(self, fsid: str, members: list[Path]) -> Path:
        """A mounted btrfs: ``fs/btrfs/<fsid>/devices/<dev>`` links to each member's block
        directory (the kernel adds them at mount; the mount table names one member)."""
        path = self.root / "fs" / "btrfs" / fsid
        for member in members:
            _link(path / "devices" / member.name, member)
        _write(path / "label", "data")
        return path

    def add_md(self, name: str, members: list[Path]) -> Path:
        """An md array ``devices/virtual/block/<md>`` with ``slaves/`` links to its members,
        each member holding it (``holders/<md>``), and ``block/<md>``."""
        path = self.root / "devices" / "virtual" / "block" / name
        _write(path / "dev", f"9:{int(name[2:]) if name[2:].isdigit() else 0}")
        (path / "holders").mkdir(parents=True, exist_ok=True)
        for member in members:
            _link(path / "slaves" / member.name, member)
            _link(member / "holders" / name, path)
        _link(self.root / "block" / name, path)
        return path

    def block_dev(self, block_dir: Path) -> str:
        """A block device's ``major:minor`` (its ``dev`` file)."""
        return (block_dir / "dev").read_text().strip()

    def add_udev_fs_type(self, udev_dir: Path, block_dir: Path, fs_type: str) -> None:
        """udev's database entry for a block device: ``b<maj:min>`` with ``E:ID_FS_TYPE``."""
        dev = (block_dir / "dev").read_text().strip()
        _write(udev_dir / f"b{dev}", f"S:disk/by-id/x\nE:ID_FS_TYPE={fs_type}\n"
                                     f"E:ID_FS_USAGE=raid")


def populate_node(tree: SysfsTree) -> SysfsTree:
    """A node holding one of everything the in-tree drivers handle, plus bystanders."""
    t = tree
    # NVIDIA: an H200 with vGPU 17+ VFs, an NVSwitch, a T4 with mdev types. MIG is off, so
    # the VFs list time-sliced types only (MIG-backed ones need MIG mode and GPU instances).
    t.add_pci("0000:41:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia", revision="0xa1")
    vfs = ["0000:41:00.4", "0000:41:00.5"]
    t.add_vfs("0000:41:00.0", vfs, "0x2335", driver="nvidia", total=16)
    for vf in vfs:
        t.add_nvidia_vfio(vf, {1418: "NVIDIA H200X-18C", 1428: "NVIDIA H200X-141C"})
    t.add_pci("0000:05:00.0", "0x10de", "0x22a3", "0x068000", driver="nvidia")
    t.add_pci("0000:06:00.0", "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    t.add_mdev_type("0000:06:00.0", "nvidia-223", "GRID T4-2B", 8)
    t.add_module_version("nvidia", "550.54.15")
    # Intel PAC (DFL) and a Xilinx U250.
    t.add_pci("0000:5e:00.0", "0x8086", "0x09c4", "0x120000", driver="dfl-pci")
    t.add_dfl_pf("0000:5e:00.0", region=0, fme=0, port=0, bitstream_id="0x2300011001030f",
                 interface_id="9346116da52d5ca8b06aa9a389ef7c8d",
                 afu_id="d8424dc4a4a3c413f89e433683f9040b")
    t.add_pci("0000:3b:00.0", "0x10ee", "0x5004", "0x120000", driver="xclmgmt")
    t.add_pci("0000:3b:00.1", "0x10ee", "0x5005", "0x120000", driver="xocl")
    # QAT 4xxx with VFs, in sym;asym mode.
    t.add_pci("0000:6b:00.0", "0x8086", "0x4940", "0x0b4000", driver="4xxx")
    t.add_vfs("0000:6b:00.0", ["0000:6b:00.1", "0000:6b:00.2"], "0x4941", driver="vfio-pci",
              total=16)
    t.add_qat_config("0000:6b:00.0")
    # A free NVMe controller.
    t.add_pci("0000:3c:00.0", "0x144d", "0xa80a", "0x010802", driver="nvme")
    t.add_nvme("0000:3c:00.0", 0, model="Samsung SSD 970 EVO Plus 1TB", serial="S4EWNX0R123456")
    # An X710 PF with VFs, its netdev enp94s0f0.
    t.add_pci("0000:5f:00.0", "0x8086", "0x1572", "0x020000", driver="i40e")
    t.add_netdev("0000:5f:00.0", "enp94s0f0")
    t.add_vfs("0000:5f:00.0", ["0000:5f:02.0", "0000:5f:02.1"], "0x154c", driver="iavf",
              total=64)
    # An Ascend 910B, and a Huawei NIC that is not one.
    t.add_pci("0000:c1:00.0", "0x19e5", "0xd802", "0x120000")
    t.add_pci("0000:3d:00.0", "0x19e5", "0x1822", "0x020000", driver="hinic")
    # Bystanders: host bridge, virtio.
    t.add_pci("0000:00:00.0", "0x8086", "0x0d57", "0x060000")
    t.add_pci("0000:00:03.0", "0x1af4", "0x1041", "0x020000", driver="virtio-pci")
    return t


#: Config overrides (make_conf keyword form) pointing every in-tree hardware driver at a tree.
def node_overrides(tree: SysfsTree, tmp_path: Path) -> dict[str, object]:
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda1 / ext4 rw 0 0\n")
    swaps = tmp_path / "swaps"
    swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n")
    overrides: dict[str, object] = {
        f"{group}__sysfs_root": str(tree.root)
        for group in ("nvidia_gpu", "intel_fpga", "xilinx_fpga", "intel_qat", "nvme", "nic",
                      "ascend")}
    overrides.update({
        "nvidia_gpu__use_nvml": False,
        "nvidia_gpu__enabled_vgpu_types": ["NVIDIA H200X-18C"],
        "nvidia_gpu__vgpu_max_instances": {"NVIDIA H200X-18C": 7},  # no NVML here
        "nvme__mounts_path": str(mounts),
        "nvme__swaps_path": str(swaps),
        "nvme__udev_data_dir": str(tmp_path / "udev-data"),
        "nvme__addresses": ["0000:3c:00.0"],
        "nic__physical_device_mappings": ["physnet2:enp94s0f0"],
        "ascend__version_info_path": str(tmp_path / "no-version.info"),
    })
    return overrides
