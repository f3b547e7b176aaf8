"""What the privsep entry points accept (acceld.privileged), and whose word decides it.

The daemons run as root for an unprivileged caller: the agent, a driver process and any
code they load. So everything the caller sends is an argument to check, never a setting.
The tool paths, the image directories and the sysfs root come from a :class:`Policy` the
entry point builds on its own side of the socket:

* in a privsep daemon, from the config files acceld-privsep-helper was started with,
  and only when every one of them is root's (owned by root, not writable by group or
  others, nor is any directory above it): the helper refuses to start on any other
  (acceld.cmd.privsep_helper), and this check, at each call, also covers a file changed
  since. The environment is not read (``OS_<GROUP>__<OPTION>`` would be the caller's
  word too).
* in process (``[agent] privileged_calls = in_process``, and tests), from the configs of
  the drivers built in this process (:func:`adopt`): that process is the privileged
  party itself, so its own config is the one to enforce. A daemon builds no driver, so
  nothing adopted by a caller ever reaches a daemon.

A policy accepts, exactly: the configured tool (absolute path, root's all the way up to
``/``) with the argv its driver builds, the image resolved under ``[agent]
bitstream_dir`` (root's all the way up, as the tool: the tool opens it after the check)
or one of the Glance source's downloads (``acceld-<id>-*`` directly in
``tempfile.gettempdir()``, which the tool gets as a private copy: :func:`pinned_downloads`); writes of ``create``/``remove``/``current_vgpu_type`` resolved under
``<sysfs_root>/devices/`` in the kernel's layout, of an NVIDIA GPU, each with its one
form of value.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from oslo_config import cfg


class NotAllowed(ValueError):
    """A privileged call outside the narrow form its entry point accepts."""


# Tool name -> the option that names its path (the drivers' [section] option).
TOOL_OPTIONS: Mapping[str, tuple[str, str]] = {
    "fpgaconf": ("intel_fpga", "fpgaconf_path"),
    "xbmgmt": ("xilinx_fpga", "xbmgmt_path"),
}
# Driver sections whose sysfs_root the sysfs context writes under.
SYSFS_WRITERS = ("nvidia_gpu",)


@dataclass(frozen=True)
class Policy:
    """The settings a privileged call is checked against (see the module docstring)."""

    tools: Mapping[str, str] = field(default_factory=dict)  # tool name -> configured path
    image_dirs: tuple[str, ...] = ()  # [agent] bitstream_dir: any regular file below
    download_dirs: tuple[str, ...] = ()  # Glance's temporary files, directly inside
    sysfs_roots: tuple[str, ...] = ()

    def merge(self, other: "Policy") -> "Policy":
        return Policy(tools={**self.tools, **other.tools},
                      image_dirs=_unique(self.image_dirs + other.image_dirs),
                      download_dirs=_unique(self.download_dirs + other.download_dirs),
                      sysfs_roots=_unique(self.sysfs_roots + other.sysfs_roots))


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def section_policy(conf: cfg.ConfigOpts, section: str) -> Policy:
    """What ``conf``'s ``[section]`` (a driver's) allows: its tool, its sysfs root, and
    ``[agent] bitstream_dir`` plus the download directory for images."""
    tools = {name: getattr(conf[group], option)
             for name, (group, option) in TOOL_OPTIONS.items() if group == section}
    roots = (conf[section].sysfs_root,) if section in SYSFS_WRITERS else ()
    images = (conf.agent.bitstream_dir,) if conf.agent.bitstream_dir else ()
    return Policy(tools=tools, image_dirs=images, download_dirs=(tempfile.gettempdir(),),
                  sysfs_roots=roots)


def conf_policy(conf: cfg.ConfigOpts) -> Policy:
    """What the whole of ``conf`` allows (every driver section)."""
    policy = Policy()
    for section in _unique([g for g, _ in TOOL_OPTIONS.values()] + list(SYSFS_WRITERS)):
        policy = policy.merge(section_policy(conf, section))
    return policy


# --- where the policy comes from -----------------------------------------------------

_adopted: dict[str, Policy] = {}


def adopt(conf: cfg.ConfigOpts, section: str) -> None:
    """Check the privileged calls that run in *this* process against ``conf``'s
    ``[section]`` (called by the drivers as they are built; the latest config of a section
    wins). Inert for calls that go to a daemon: the daemon reads its own config."""
    _adopted[section] = section_policy(conf, section)


def forget_adopted() -> None:
    """Back to no adopted config (tests)."""
    _adopted.clear()


def current() -> Policy:
    """The adopted configs' policy where this process adopted any, else the daemon's."""
    if _adopted:
        policy = Policy()
        for part in _adopted.values():
            policy = policy.merge(part)
        return policy
    files, dirs = _started_with()
    return daemon_policy(files, dirs)


def _started_with() -> tuple[list[str], list[str]]:
    """The config files and dirs the process's global config was parsed from: in a privsep
    daemon, the helper's config files (none before parsing)."""
    try:
        return list(cfg.CONF.config_file or []), list(cfg.CONF.config_dir or [])
    except cfg.NoSuchOptError:
        return [], []


def daemon_policy(files: Sequence[str], dirs: Sequence[str]) -> Policy:
    """The policy of the config in ``files`` and ``dirs``, each checked to be root's; the
    environment is ignored. No files: the built-in defaults."""
    import acceld.conf

    for path in files:
        check_trusted(path, "privsep config file")
    for directory in dirs:
        check_trusted(directory, "privsep config directory")
        for name in sorted(os.listdir(directory)):
            if name.endswith(".conf"):
                check_trusted(os.path.join(directory, name), "privsep config file")
    conf = cfg.ConfigOpts()
    acceld.conf.register_opts(conf)
    conf([], project="acceld", prog="acceld", default_config_files=list(files),
         default_config_dirs=list(dirs), use_env=False)
    return conf_policy(conf)


# --- trusted files -------------------------------------------------------------------

def _trusted_owners() -> set[int]:
    """Root, and the process's own user: in a daemon (euid 0) that is root alone; in
    process as another user (tests), that user's files are no less its own."""
    return {0, os.geteuid()}


def check_trusted(path: str, what: str) -> str:
    """``path`` resolved, when it and every directory above it are owned by root and
    writable by no group or other user. A world-writable directory passes only with its
    sticky bit (``/tmp``): there no one else may rename or remove the root-owned entry
    below it, which is checked in turn."""
    real = os.path.realpath(path)
    owners = _trusted_owners()
    current_path = real
    while True:
        try:
            st = os.lstat(current_path)
        except OSError as exc:
            raise NotAllowed(f"{what} {path!r}: {exc.strerror}: {current_path}") from None
        if st.st_uid not in owners:
            raise NotAllowed(f"{what} {path!r}: {current_path} is owned by uid {st.st_uid}, "
                             f"not root")
        open_to_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if open_to_others and (current_path == real or not sticky_dir):
            raise NotAllowed(f"{what} {path!r}: {current_path} is writable by group or "
                             f"others")
        parent = os.path.dirname(current_path)
        if parent == current_path:
            return real
        current_path = parent


# --- vendor tools --------------------------------------------------------------------

_PCI = r"[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]"
_DOWNLOAD = r"acceld-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-[A-Za-z0-9_]+"
_FPGACONF_FIELDS = {"--segment": r"0x[0-9a-f]{4}", "--bus": r"0x[0-9a-f]{2}",
                    "--device": r"0x[01][0-9a-f]", "--function": r"0x[0-7]"}


def check_image(policy: Policy, path: str) -> str:
    """An image file, resolved: a regular file under an image directory, or one of the
    Glance source's downloads (``acceld-<image id>-<random>`` directly in the temporary
    directory: acceld.agent.images)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise NotAllowed(f"image path must be absolute: {path!r}")
    real = os.path.realpath(path)
    inside = any(real != top and os.path.commonpath([top, real]) == top
                 for top in map(os.path.realpath, policy.image_dirs))
    downloaded = is_download(policy, real)
    if not (inside or downloaded):
        raise NotAllowed(f"image {path!r} is neither under [agent] bitstream_dir "
                         f"({', '.join(policy.image_dirs) or 'unset'}) nor a download in "
                         f"{', '.join(policy.download_dirs)}")
    # Under an image directory, nothing on the image's path may be swapped between this
    # check and the tool's own open: the file and each directory above it must be root's.
    if inside and check_trusted(real, "image") != real:
        raise NotAllowed(f"image {path!r} changed while it was checked")
    try:
        st = os.stat(real)
    except OSError as exc:
        raise NotAllowed(f"image {path!r}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotAllowed(f"image {path!r} is not a regular file")
    if downloaded and not inside and st.st_nlink != 1:  # mkstemp's file has one name
        raise NotAllowed(f"image {path!r} has other links: not a download")
    return real


def is_download(policy: Policy, real: str) -> bool:
    """Whether the resolved ``real`` is named and placed as a Glance download."""
    return re.fullmatch(_DOWNLOAD, os.path.basename(real)) is not None and any(
        os.path.dirname(real) == os.path.realpath(d) for d in policy.download_dirs)


@contextlib.contextmanager
def pinned_downloads(policy: Policy, argv: Sequence[str]) -> Iterator[list[str]]:
    """``argv`` (checked) with each Glance download replaced by a private copy of what was
    checked, removed after. A download is the caller's own file in a directory where the
    caller may put anything in its place between the check and the tool's open (a link
    to root's file, where fs.protected_symlinks is off): it is opened here without
    following a link, must still be a regular file with one name, and is copied into a
    new directory only this process can enter, under its own name."""
    out, made = list(argv), []
    try:
        for i, arg in enumerate(out):
            if i == 0 or not os.path.isabs(arg) or not is_download(policy, arg):
                continue
            fd = os.open(arg, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as source:
                st = os.fstat(source.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    raise NotAllowed(f"image {arg!r} changed after it was checked")
                made.append(tempfile.mkdtemp(prefix="acceld-image-"))
                out[i] = os.path.join(made[-1], os.path.basename(arg))
                with open(os.open(out[i], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                          "wb") as copy:
                    shutil.copyfileobj(source, copy)
        yield out
    finally:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)


def _fpgaconf_args(policy: Policy, args: list[str]) -> list[str]:
    """``[--segment 0xDDDD] --bus 0xBB --device 0xDD --function 0xF <image>``
    (acceld.drivers.intel_fpga)."""
    flags = ["--bus", "--device", "--function"]
    if args[:1] == ["--segment"]:
        flags.insert(0, "--segment")
    if len(args) != 2 * len(flags) + 1:
        raise NotAllowed(f"not the fpgaconf arguments acceld passes: {args!r}")
    for i, flag in enumerate(flags):
        if args[2 * i] != flag or not re.fullmatch(_FPGACONF_FIELDS[flag], args[2 * i + 1]):
            raise NotAllowed(f"not the fpgaconf arguments acceld passes: {args!r}")
    return args[:-1] + [check_image(policy, args[-1])]


def _xbmgmt_args(policy: Policy, args: list[str]) -> list[str]:
    """``program --device <BDF> --shell <image> --force`` or ``program --device <BDF>
    --base --image <image> --force`` (acceld.drivers.xilinx_fpga)."""
    if len(args) == 6:
        form = ["program", "--device", None, "--shell", None, "--force"]
    elif len(args) == 7:
        form = ["program", "--device", None, "--base", "--image", None, "--force"]
    else:
        raise NotAllowed(f"not the xbmgmt arguments acceld passes: {args!r}")
    fixed_ok = all(want is None or got == want for got, want in zip(args, form))
    if not fixed_ok or not re.fullmatch(_PCI, args[2]):
        raise NotAllowed(f"not the xbmgmt arguments acceld passes: {args!r}")
    image_at = len(args) - 2
    return args[:image_at] + [check_image(policy, args[image_at])] + args[image_at + 1:]


_TOOL_ARGS: Mapping[str, Callable[[Policy, list[str]], list[str]]] = {
    "fpgaconf": _fpgaconf_args, "xbmgmt": _xbmgmt_args}


def check_tool(policy: Policy, argv: Sequence[str]) -> list[str]:
    """The argv to run (tool and image resolved) when ``argv`` is exactly the configured
    tool with its driver's arguments; NotAllowed otherwise."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise NotAllowed(f"not a vendor tool acceld runs: {list(argv)[:1]!r}")
    name = os.path.basename(argv[0])
    configured = policy.tools.get(name)
    if configured is None or not os.path.isabs(argv[0]):
        raise NotAllowed(f"not a vendor tool acceld runs: {argv[0]!r}")
    group, option = TOOL_OPTIONS[name]
    if not os.path.isabs(configured):
        raise NotAllowed(f"[{group}] {option} = {configured!r} is not an absolute path: "
                         f"a privileged tool is run only by its full path")
    if argv[0] != configured:
        raise NotAllowed(f"not a vendor tool acceld runs: {argv[0]!r} is not [{group}] "
                         f"{option} ({configured!r})")
    real = check_trusted(configured, f"[{group}] {option}")
    if not stat.S_ISREG(os.stat(real).st_mode):
        raise NotAllowed(f"[{group}] {option} {configured!r} is not a regular file")
    return [real] + _TOOL_ARGS[name](policy, list(argv[1:]))


# --- sysfs attributes ----------------------------------------------------------------

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_MDEV_TYPE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"

# Attribute -> (the directories above it, nearest last, as patterns; its one form of value):
# <device>/mdev_supported_types/<type>/create <- an mdev uuid
# <device>/<mdev uuid>/remove <- "1"
# <vf>/nvidia/current_vgpu_type <- a vGPU type id (0: none)
SYSFS_ATTRIBUTES: Mapping[str, tuple[tuple[str, ...], str]] = {
    "create": ((_PCI, "mdev_supported_types", _MDEV_TYPE), _UUID),
    "remove": ((_PCI, _UUID), "1"),
    "current_vgpu_type": ((_PCI, "nvidia"), r"0|[1-9][0-9]{0,9}"),
}


def check_sysfs(policy: Policy, path: str, value: str) -> str:
    """The resolved attribute to write when ``path`` and ``value`` are one of the forms in
    :data:`SYSFS_ATTRIBUTES` under a sysfs root's ``devices/``; NotAllowed otherwise."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r}")
    real = os.path.realpath(path)
    form = SYSFS_ATTRIBUTES.get(os.path.basename(real))
    if form is None:
        raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r}")
    devices = [os.path.join(os.path.realpath(root), "devices") for root in policy.sysfs_roots]
    below = [(d, real[len(d) + 1:]) for d in devices if real.startswith(d + os.sep)]
    if not below:
        raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r} is not under "
                         f"{' or '.join(devices) or 'a sysfs root'}")
    parents, value_form = form
    top, rest = below[0]
    dirs = rest.split(os.sep)[:-1]
    if len(dirs) < len(parents) or not all(
            re.fullmatch(pattern, part)
            for pattern, part in zip(parents, dirs[-len(parents):])):
        raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r}")
    # The PCI function the attribute belongs to (each form's first parent): an NVIDIA GPU,
    # the one kind of device acceld's sysfs writer (the nvidia_gpu driver) drives.
    if not _is_nvidia_gpu(os.path.join(top, *dirs[:len(dirs) - len(parents) + 1])):
        raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r} is not an "
                         f"NVIDIA GPU's")
    if not isinstance(value, str) or not re.fullmatch(value_form, value):
        raise NotAllowed(f"not a value acceld writes to {os.path.basename(real)}: {value!r}")
    return real


# --- NVML reads that need a privileged user ---------------------------------------------

_NVIDIA = "0x10de"


def check_gpu(policy: Policy, address: str) -> str:
    """``address`` when it names an NVIDIA display-class function (a GPU, class 0x03xx)
    under a sysfs root's ``bus/pci/devices``; NotAllowed otherwise. The only argument of
    the privileged GPU-instance read (acceld.privileged.read_gpu_instances)."""
    if not isinstance(address, str) or not re.fullmatch(_PCI, address):
        raise NotAllowed(f"not a PCI address: {address!r}")
    if any(_is_nvidia_gpu(os.path.join(root, "bus", "pci", "devices", address))
           for root in policy.sysfs_roots):
        return address
    raise NotAllowed(f"not an NVIDIA GPU acceld reads: {address!r}")


def _is_nvidia_gpu(device: str) -> bool:
    """Whether the PCI function whose sysfs directory is ``device`` is an NVIDIA
    display-class function (vendor 0x10de, class 0x03xxxx)."""
    try:
        with open(os.path.join(device, "vendor")) as f:
            vendor = f.read().strip()
        with open(os.path.join(device, "class")) as f:
            class_code = f.read().strip()
    except OSError:
        return False
    return vendor == _NVIDIA and re.fullmatch(r"0x03[0-9a-f]{4}", class_code) is not None
