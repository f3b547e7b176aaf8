"""`acceld claim PROFILE [--host H] [--consumer U]` and `acceld release ARQ...`: standalone
claims (API 2.8) from a shell, for workloads that are not Nova instances.

A client of the public API, not of the database: it runs wherever the API is reachable, as
the caller whose token it sends (``OS_TOKEN``, or none against a noauth API such as the
all-in-one), so the API's policy and quota apply to it as to any client. ``claim`` creates
the ARQs, waits up to ``--wait`` seconds for the conductor to bind them, and prints each
one's attach handle (the workload's device); ``release`` deletes ARQs, which frees their
handles and removes their Placement allocation. Exit status: 0 done; 1 a bind failed or did
not finish in time; 2 the API refused (its message is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import orjson

DEFAULT_URL = "http://127.0.0.1:6680/accelerator/v2"
OK, NOT_BOUND, REFUSED = 0, 1, 2
POLL = 0.2


class ApiRefused(Exception):
    pass


def _session(args: argparse.Namespace) -> tuple[Any, str]:
    import requests

    session = requests.Session()
    session.headers["OpenStack-API-Version"] = "accelerator 2.8"
    token = os.environ.get("OS_TOKEN")
    if token:
        session.headers["X-Auth-Token"] = token
    return session, (args.url or os.environ.get("ACCELD_API_URL") or DEFAULT_URL).rstrip("/")


def _message(resp: Any) -> str:
    """The fault string of an API error (or its text)."""
    try:
        return str(orjson.loads(resp.json()["error_message"])["faultstring"])
    except Exception:  # noqa: BLE001 - any other body is shown as it is
        return resp.text[:500]


def _call(session: Any, method: str, url: str, ok: tuple[int, ...], **kwargs: Any) -> Any:
    resp = session.request(method, url, timeout=30, **kwargs)
    if resp.status_code not in ok:
        raise ApiRefused(f"{resp.status_code} {_message(resp)}")
    return resp


def describe(arq: dict) -> str:
    """One line per ARQ: its state, where, and the attach handle the workload uses."""
    head = f"ARQ {arq['uuid']} {arq['state']}"
    if arq["state"] == "Bound":
        info = orjson.dumps(arq["attach_handle_info"], option=orjson.OPT_SORT_KEYS).decode()
        return (f"{head} on {arq['hostname']} (consumer {arq.get('consumer_uuid')}): "
                f"{arq['attach_handle_type']} {info}")
    reason = arq.get("bind_failure_reason")
    return f"{head} on {arq['hostname']}" + (f": {reason}" if reason else "")


def cmd_claim(args: argparse.Namespace) -> int:
    session, base = _session(args)
    body: dict[str, Any] = {"device_profile_name": args.profile,
                            "claim": {"hostname": args.host} if args.host else {}}
    if args.consumer:
        body["consumer_uuid"] = args.consumer
    try:
        arqs = _call(session, "POST", f"{base}/accelerator_requests", (201,),
                     json=body).json()["arqs"]
        deadline = time.monotonic() + args.wait
        while True:
            arqs = [_call(session, "GET", f"{base}/accelerator_requests/{a['uuid']}",
                          (200,)).json() for a in arqs]
            if all(a["state"] != "BindStarted" for a in arqs) or time.monotonic() > deadline:
                break
            time.sleep(POLL)
    except ApiRefused as exc:
        print(f"acceld claim: {exc}", file=sys.stderr)
        return REFUSED
    for arq in arqs:
        print(describe(arq))
    return OK if all(a["state"] == "Bound" for a in arqs) else NOT_BOUND


def cmd_release(args: argparse.Namespace) -> int:
    session, base = _session(args)
    status = OK
    for arq in args.arqs:
        try:
            _call(session, "DELETE", f"{base}/accelerator_requests/{arq}", (204,))
        except ApiRefused as exc:
            print(f"acceld release: ARQ {arq}: {exc}", file=sys.stderr)
            status = REFUSED
            continue
        print(f"ARQ {arq} released")
    return status


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"The API's v2 URL (default $ACCELD_API_URL, else "
                                 f"{DEFAULT_URL}). A token is taken from $OS_TOKEN.")


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("claim", help="Claim accelerators of a device profile without Nova "
                                     "(API 2.8) and print their attach handles.")
    p.add_argument("profile", help="The device profile's name.")
    p.add_argument("--host", help="Claim on this host (default: acceld picks one, through "
                                  "Placement when configured).")
    p.add_argument("--consumer", help="The Placement consumer uuid the claim's allocation is "
                                      "written under (several claims of one workload).")
    p.add_argument("--wait", type=float, default=30.0,
                   help="Seconds to wait for the binds (default 30).")
    _client_options(p)
    p.set_defaults(func=cmd_claim)
    p = sub.add_parser("release", help="Release standalone claims: free their attach handles "
                                       "and remove their Placement allocations.")
    p.add_argument("arqs", nargs="+", metavar="ARQ", help="The ARQ uuid(s).")
    _client_options(p)
    p.set_defaults(func=cmd_release)
