"""The in-process drivers' groups: ``[fake_driver]``, ``[pci_driver]`` and one group per
in-tree hardware driver (``[nvidia_gpu]``, ``[intel_fpga]``, ``[xilinx_fpga]``,
``[intel_qat]``, ``[nvme]``, ``[nic]``, ``[ascend]``; acceld/drivers/<group>.py)."""

from __future__ import annotations

from oslo_config import cfg

fake_driver_opts = [
    cfg.ListOpt("devices", default=["FPGA"],
                help="Simulated devices, one entry per device, by type: FPGA, GPU, QAT, "
                     "AICHIP, NIC, SSD. The default is what upstream's fake driver reports: "
                     "one FPGA named FakeDevice."),
    cfg.IntOpt("attach_handles", default=16, min=1, max=256,
               help="Attach handles (and accelerators) per simulated device."),
    cfg.StrOpt("spec_file",
               help="JSON file describing the simulated devices, read again at every "
                    "discovery (so a running demo or test can change its hardware). "
                    "Overrides `devices`; see docs/drivers.md for its format."),
    cfg.StrOpt("state_dir",
               help="Where programming is recorded (one JSON file per deployable). "
                    "Unset: <state_path>/fake_driver."),
    cfg.StrOpt("attach_type", default="TEST_PCI", choices=["TEST_PCI", "MDEV"],
               help="Attach handles of the simulated devices. MDEV simulates vGPU-style "
                    "handles that must be prepared on bind and released after unbind "
                    "(recorded under state_dir); the default is upstream's TEST_PCI."),
]

pci_driver_opts = [
    cfg.StrOpt("sysfs_root", default="/sys",
               help="Root of the sysfs tree scanned (devices under bus/pci/devices)."),
    cfg.MultiStrOpt("device_spec",
                    deprecated_opts=[cfg.DeprecatedOpt("passthrough_whitelist", group="pci")],
                    default=['[{"vendor_id": "10de"}, {"vendor_id": "1002"}, '
                             '{"vendor_id": "8086"}, {"vendor_id": "10ee"}, '
                             '{"vendor_id": "1172"}, {"vendor_id": "19e5"}, '
                             '{"vendor_id": "1da3"}]'],
                    help="Nova-style allow-list (repeatable; each value a JSON object or a "
                         "list of objects) with vendor_id, product_id, address (glob string "
                         "or regex object) and the tags resource_class and traits. A PCI "
                         "function is reported when any entry matches and its class is in "
                         "device_classes."),
    cfg.ListOpt("device_classes", default=["0x0300", "0x0302", "0x0380", "0x1200", "0x0b40"],
                help="PCI classes (base and sub class, 0xBBSS) the driver reports; the class "
                     "decides the device type: 03xx GPU, 1200 FPGA or AICHIP, 0b40 QAT, "
                     "0108 SSD, 0200 NIC. Others cannot be reported."),
    cfg.StrOpt("rc", default="CUSTOM_PCI",
               help="Resource class of PCI deployables when the matching allow-list entry "
                    "names none."),
]

# In-tree hardware drivers (acceld/drivers/<group>.py): one group per driver.


def _sysfs_root_opt() -> cfg.StrOpt:
    return cfg.StrOpt("sysfs_root", default="/sys",
                      help="Where sysfs is mounted; tests point it at a fixture tree.")


def _resource_class_opt(default: str) -> cfg.StrOpt:
    return cfg.StrOpt("resource_class", default=default, regex=r"^(CUSTOM_)?[A-Z0-9_]+$",
                      help="Placement resource class of this driver's deployables.")


def _tool_timeout_opt() -> cfg.IntOpt:
    return cfg.IntOpt("program_timeout", default=90, min=1,
                      help="Seconds a programming tool may run before it is stopped and "
                           "the program request fails. Keep it below [conductor] "
                           "program_timeout, which bounds the whole request.")


_hardware_opts: dict[str, list[cfg.Opt]] = {
    "nvidia_gpu": [
        _sysfs_root_opt(),
        cfg.BoolOpt("use_nvml", default=True,
                    help="Use NVML (nvidia-ml-py) when it imports and initialises; "
                         "otherwise, or when false, read sysfs only."),
        cfg.ListOpt("enabled_vgpu_types", default=[],
                    help="vGPU types to offer, by mdev type id (nvidia-223) or type name "
                         "(GRID T4-2B, NVIDIA H200X-1-18C). A GPU offering one of them is "
                         "not offered whole (PGPU)."),
        cfg.Opt("vgpu_max_instances", default={},
                type=cfg.types.Dict(value_type=cfg.types.Integer(min=0)),
                help="Most vGPUs of a type one GPU holds, by type name or id "
                     "(NVIDIA H200X-1-18C:7), used when NVML does not answer (as Nova's "
                     "[mdev_<type>] max_instances). NVML's maximum wins where NVML "
                     "answers. Without either, vGPUs on SR-IOV VFs are not offered."),
        cfg.ListOpt("ignored_xids", default=[13, 31, 43, 45, 68, 109],
                    item_type=cfg.types.Integer(min=0),
                    help="XID events that do not make a GPU unhealthy: the application "
                         "errors NVIDIA's Kubernetes device plugin ignores. Every other "
                         "critical XID does, until the agent restarts."),
        cfg.StrOpt("proc_root", default="/proc",
                   help="Where procfs is mounted: the MIG capability files "
                        "(driver/nvidia/capabilities/gpu<N>/mig/gi<id>) tell which GPU "
                        "instances exist when NVML refuses the unprivileged agent and the "
                        "privsep daemon cannot read them either."),
    ],
    "intel_fpga": [
        _sysfs_root_opt(),
        cfg.StrOpt("fpgaconf_path", default="/usr/bin/fpgaconf",
                   help="OPAE's fpgaconf, used to program bitstreams."),
        _tool_timeout_opt(),
    ],
    "xilinx_fpga": [
        _sysfs_root_opt(),
        cfg.StrOpt("xbmgmt_path", default="/opt/xilinx/xrt/bin/xbmgmt",
                   help="XRT's xbmgmt, used to program the shell and the base firmware."),
        _tool_timeout_opt(),
    ],
    "intel_qat": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_QAT"),
    ],
    "nvme": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_SSD"),
        cfg.StrOpt("mounts_path", default="/proc/self/mountinfo",
                   help="The mount table, in mountinfo form (mounts matched by major:minor, "
                        "so /dev/root counts) or /proc/mounts form (by source name only); a "
                        "controller with a mounted namespace is never offered. An agent in a "
                        "container reads the host's: /proc/1/mountinfo with the host's PID "
                        "namespace."),
        cfg.ListOpt("addresses", default=[],
                    help="PCI addresses of the controllers to offer (only these, and only "
                         "while the host does not use them). Empty: none is offered."),
        cfg.StrOpt("swaps_path", default="/proc/swaps",
                   help="The swap table; a controller with an active swap namespace or "
                        "partition is never offered."),
        cfg.StrOpt("udev_data_dir", default="/run/udev/data",
                   help="udev's database (b<major>:<minor> files): a namespace or partition "
                        "whose ID_FS_TYPE is a member signature (zfs_member, LVM2_member, "
                        "linux_raid_member, ...) is in use."),
        cfg.StrOpt("nvme_cli_path", default="nvme",
                   help="nvme-cli, used for the SMART critical warning (health). Absent: "
                        "health from PCIe only."),
        cfg.IntOpt("smart_timeout", default=10, min=1,
                   help="Seconds one 'nvme smart-log' may run."),
    ],
    "nic": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_NIC"),
        cfg.ListOpt("physical_device_mappings", default=[], deprecated_group="x710_static",
                    help="physnet:PF pairs, e.g. physnet2:enp94s0f0 or "
                         "physnet2:0000:5e:00.0 (a netdev name or a PCI address). Only "
                         "these PFs are reported; their VFs carry CUSTOM_PHYSNET_<NAME> "
                         "and upstream's CUSTOM_<NAME>, and their attach handles the "
                         "physical_network."),
        cfg.ListOpt("function_device_mappings", default=[], deprecated_group="x710_static",
                    help="function:PF pairs as upstream's [x710_static] "
                         "function_device_mappings (e.g. GTPv1:enp94s0f0): the PF's VFs "
                         "carry the trait CUSTOM_<FUNCTION>."),
    ],
    "ascend": [
        _sysfs_root_opt(),
        _resource_class_opt("CUSTOM_ASCEND"),
        cfg.StrOpt("version_info_path", default="/usr/local/Ascend/driver/version.info",
                   help="The Ascend driver's version.info (Version=...)."),
    ],
}

DRIVER_OPTS: dict[str, list[cfg.Opt]] = {
    "fake_driver": fake_driver_opts,
    "pci_driver": pci_driver_opts,
    **_hardware_opts,
}


def register_opts(conf: cfg.ConfigOpts) -> None:
    for group, opts in DRIVER_OPTS.items():
        conf.register_opts(opts, group=group)


def list_opts() -> dict[str, list[cfg.Opt]]:
    return dict(DRIVER_OPTS)
