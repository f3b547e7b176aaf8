"""Nova's own Cyborg client (nova.accelerator.cyborg) driven as nova-conductor and
nova-compute drive it: run by Nova's interpreter (.nova/venv), never imported by acceld's
tests.

    .nova/venv/bin/python tests/support/nova_cyborg_calls.py NOVA_CONF REQUEST_JSON

REQUEST_JSON names the user's token and ids (the request context Nova builds from the
user's API call), the device profile, the host, the device provider and the instance.
nova.conf's [cyborg] says where acceld is; [service_user] whether Nova adds its own token.
Prints one JSON object: what each call returned, or the error Nova raised.
"""

import json
import sys


def main(conf_path: str, request_path: str) -> None:
    import nova.conf
    from nova import context
    from nova.accelerator import cyborg

    with open(request_path) as handle:
        req = json.load(handle)
    nova.conf.CONF(["--config-file", conf_path], project="nova")
    ctx = context.RequestContext(user_id=req["user_id"], project_id=req["project_id"],
                                 auth_token=req["token"], roles=["member", "reader"])
    client = cyborg.get_client(ctx)
    out: dict = {}

    def step(name, call):  # type: ignore[no-untyped-def]
        try:
            out[name] = call()
        except Exception as exc:  # noqa: BLE001 - reported to the test as Nova sees it
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out[name]

    step("groups", lambda: client.get_device_profile_groups(req["profile"]))
    arqs = step("created", lambda: [a["uuid"] for a in client.create_arqs(req["profile"])])
    step("bind", lambda: client.bind_arqs({uuid: {
        "hostname": req["host"], "device_rp_uuid": req["rp"],
        "instance_uuid": req["instance"]} for uuid in arqs}) or "ok")
    step("for_instance", lambda: [{"uuid": a["uuid"], "state": a["state"]}
                                  for a in client.get_arqs_for_instance(req["instance"])])
    step("delete_by_instance", lambda: client.delete_arqs_for_instance(req["instance"]) or "ok")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
