"""Which endpoint a hello may register: the address the hello came from.

The conductor calls the endpoint a node registers (its pulls of ``GET /hardware``,
attach preparations, programs), so an endpoint chosen freely would let one node's key
point those calls at another host, or at a port on the controller's loopback (its
database, Keystone). A hello's endpoint is therefore accepted only when its host is

- the address the hello came from, or an address in ``[conductor] agent_networks``
  (conductors behind a load balancer or NAT, where the source is not the agent's);
- a loopback address (or ``localhost``) only when the hello itself came over loopback
  (an agent on the conductor's own host), whatever ``agent_networks`` says;

and always an address, not a name: a name could resolve elsewhere at the next call.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(values: Iterable[str]) -> list[Network]:
    """``[conductor] agent_networks`` as networks (a bad entry stops the conductor)."""
    return [ipaddress.ip_network(value.strip(), strict=False) for value in values if value]


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def endpoint_host(endpoint: str) -> str:
    """The host of ``host:port`` or ``scheme://host:port``, without IPv6 brackets."""
    rest = endpoint.split("://", 1)[-1]
    return rest.rpartition(":")[0].strip("[]")


def refusal(endpoint: str, source: str, allowed: Iterable[Network] = ()) -> str | None:
    """None when a hello from ``source`` may register ``endpoint``; else why not (for the
    400 and the log)."""
    host = endpoint_host(endpoint)
    sender = _address(source)
    local = sender is not None and sender.is_loopback
    if host.lower() == "localhost":
        return None if local else (f"the endpoint {endpoint!r} is on loopback, but the hello "
                                   f"came from {source}")
    address = _address(host)
    if address is None:
        return (f"the endpoint {endpoint!r} names its host; give its address "
                "([agent] advertise_endpoint)")
    if address.is_loopback:
        return None if local else (f"the endpoint {endpoint!r} is on loopback, but the hello "
                                   f"came from {source}")
    if address.is_unspecified or address.is_multicast:
        return f"the endpoint {endpoint!r} is not the address of one host"
    if address == sender or any(address in network for network in allowed):
        return None
    return (f"the endpoint {endpoint!r} is not the address the hello came from ({source}) "
            "nor in [conductor] agent_networks")
