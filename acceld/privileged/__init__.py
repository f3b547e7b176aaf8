"""What the agent and its driver processes do as root, through oslo.privsep.

The agent runs as an unprivileged user. The few operations that need more go
through a privsep daemon that keeps only the capabilities named here, started on
first use with ``[privsep_sysfs]`` / ``[privsep_tools]`` / ``[privsep_nvml]``
``helper_command`` (production: ``sudo /opt/acceld/bin/acceld-privsep-helper --config-file
/etc/acceld/acceld.conf``, acceld.cmd.privsep_helper, which accepts nothing but that and
the two options privsep appends):

* ``sysfs``: writes to a device's sysfs attributes (create or remove a mediated
  device, choose a vGPU type): CAP_DAC_OVERRIDE, because those attributes are
  root-owned files of mode 0200.
* ``tools``: a vendor programming tool (fpgaconf, xbmgmt): CAP_SYS_ADMIN and
  CAP_DAC_OVERRIDE (device nodes and flash partitions).
* ``nvml``: NVML reads NVML documents as needing a privileged user (the GPU instances of
  a MIG-enabled GPU, ``nvmlDeviceGetGpuInstanceById``): CAP_SYS_ADMIN, which holds every
  nvidia-capability (NVIDIA's MIG user guide). Read only.

Each entry point accepts only the narrow form of its operation, checked on its own
side against its own config (acceld.privileged.policy: the exact configured tool with
its driver's arguments; an existing attribute under sysfs ``devices/`` with its one form
of value), so the daemon cannot be used as a general root shell by whoever reaches the
agent's code. docs/security.md lists them.

Without a daemon (``[agent] privileged_calls = in_process``, and always in a
process that never called :func:`configure`, such as unit tests) the entry
points run in the calling process: for an agent that already runs as root, the
all-in-one, and tests against fixture trees. The same checks apply there, against
the config of the drivers built in that process (:func:`adopt`).
"""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Sequence

from oslo_config import cfg
from oslo_privsep import priv_context

from acceld.conf import agent as agent_opts
from acceld.conf import privsep as privsep_opts
from acceld.privileged import policy as privileged_policy
from acceld.privileged.policy import NotAllowed, adopt

__all__ = ["NotAllowed", "adopt", "configure", "read_gpu_instances", "run_tool",
           "write_sysfs"]

# Attributes the drivers write: mdev_supported_types/<type>/create, <mdev>/remove,
# and NVIDIA's per-VF current_vgpu_type.
SYSFS_ATTRIBUTES = frozenset(privileged_policy.SYSFS_ATTRIBUTES)
# Vendor tools the drivers run, by executable name.
TOOLS = frozenset(privileged_policy.TOOL_OPTIONS)
# Neither O_CREAT (an attribute exists or the write fails) nor following a final link;
# O_NONBLOCK so that a FIFO in the way fails rather than blocks the daemon.
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# Each context's capabilities: the defaults of their sections' options (acceld.conf.privsep).
SYSFS_CAPABILITIES = privsep_opts.capabilities("privsep_sysfs")
TOOLS_CAPABILITIES = privsep_opts.capabilities("privsep_tools")
NVML_CAPABILITIES = privsep_opts.capabilities("privsep_nvml")

sysfs = priv_context.PrivContext(
    "acceld", cfg_section="privsep_sysfs", pypath=__name__ + ".sysfs",
    capabilities=list(SYSFS_CAPABILITIES))

tools = priv_context.PrivContext(
    "acceld", cfg_section="privsep_tools", pypath=__name__ + ".tools",
    capabilities=list(TOOLS_CAPABILITIES))

nvml = priv_context.PrivContext(
    "acceld", cfg_section="privsep_nvml", pypath=__name__ + ".nvml",
    capabilities=list(NVML_CAPABILITIES))

CONTEXTS = (sysfs, tools, nvml)

# In process until configure() says otherwise (tests, tools that import the drivers).
for _context in CONTEXTS:
    _context.set_client_mode(False)

def configure(conf: cfg.ConfigOpts) -> None:
    """Called by the agent and driver processes at start: use the privsep daemons unless
    ``[agent] privileged_calls = in_process``."""
    agent_opts.register_opts(conf)
    daemon = conf.agent.privileged_calls == "privsep"
    for context in CONTEXTS:
        context.set_client_mode(daemon)


@sysfs.entrypoint
def write_sysfs(path: str, value: str) -> None:
    """Write ``value`` to an existing device attribute of a form acceld writes
    (NotAllowed otherwise; OSError as open/write raise it, e.g. when it is missing)."""
    real = privileged_policy.check_sysfs(privileged_policy.current(), path, value)
    fd = os.open(real, _WRITE_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAllowed(f"not a sysfs attribute acceld writes: {path!r}")
        data = value.encode()
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {real}")
    finally:
        os.close(fd)


@tools.entrypoint
def run_tool(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    """Run a vendor tool: (exit status, stdout, stderr); exit status None when it did not
    finish within ``timeout`` seconds (it was killed). NotAllowed unless ``argv`` is the
    configured tool with its driver's arguments; OSError when it cannot start."""
    policy = privileged_policy.current()
    argv = privileged_policy.check_tool(policy, list(argv))
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout:
        raise NotAllowed(f"a tool's timeout must be a positive number of seconds: {timeout!r}")
    with privileged_policy.pinned_downloads(policy, argv) as pinned:
        try:
            done = subprocess.run(pinned, capture_output=True, text=True, timeout=timeout,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return None, _text(exc.stdout), _text(exc.stderr)
    return done.returncode, done.stdout, done.stderr


def _nvml_module():  # type: ignore[no-untyped-def]
    """pynvml, in the daemon (tests replace this function with a stand-in)."""
    import importlib

    return importlib.import_module("pynvml")


@nvml.entrypoint
def read_gpu_instances(address: str) -> list[list[int]]:
    """``[[gpu instance id, profile id], ...]`` of the NVIDIA GPU at ``address`` (none when
    MIG is off). NotAllowed unless ``address`` is an NVIDIA GPU under the sysfs root; an
    NVML refusal comes back as the error's name and text in a RuntimeError."""
    from acceld.drivers.nvidia_nvml import error_text, gpu_instances_at

    address = privileged_policy.check_gpu(privileged_policy.current(), address)
    module = _nvml_module()
    try:
        return [[gi, profile] for gi, profile in gpu_instances_at(module, address)]
    except module.NVMLError as exc:
        # NVMLError subclasses do not cross the privsep socket as themselves.
        raise RuntimeError(f"NVML: {error_text(exc)}") from None


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")
