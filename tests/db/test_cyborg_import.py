"""`acceld db import-cyborg`: an upstream Cyborg 17 database, made and filled by upstream's own
code (tests/support/upstream_cyborg.py), carried into acceld's on every backend.

Every upstream row is compared with the row acceld holds under the same uuid, foreign keys
followed by uuid on both sides; the dry run changes nothing; a second import is refused and
changes nothing; other schema revisions are refused naming the revision; upstream's database
is the same afterwards; Nova reads the same ARQs, instances and attach handles through
acceld's API.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from falcon import testing
from sqlalchemy import create_engine, func, select, text

from acceld.api.app import build_app
from acceld.cmd import main as cli
from acceld.db import cyborg_import, migrate
from acceld.db.engine import Database
from acceld.db.models import (accelerator_requests, attach_handles, attributes, bind_jobs,
                              controlpath_ids, deployables, device_profiles, devices)
from tests.conftest import make_conf
from tests.helpers import SERVICE
from tests.support import upstream_cyborg

UP_TABLES = ("devices", "controlpath_ids", "deployables", "attributes", "attach_handles",
             "device_profiles", "extended_accelerator_requests", "quota_usages",
             "reservations", "alembic_version")
OURS = (device_profiles, devices, controlpath_ids, deployables, attributes, attach_handles,
        accelerator_requests)


def _when(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def dump(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of upstream's tables, read with plain SQL (not the import's code)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {name: [dict(r) for r in conn.execute(
                text(f"SELECT * FROM {name}")).mappings()] for name in UP_TABLES}
    finally:
        engine.dispose()


def expected(up: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, tuple]]:
    """What acceld must hold for upstream's rows, per table, by uuid (references as uuids).
    The rules are the import's documented ones: a device being cleaned is maintaining;
    a bind upstream left in progress holds no handle and its handle is free again."""
    uuid_of = {name: {r["id"]: r["uuid"] for r in up[name]} for name in (
        "devices", "controlpath_ids", "deployables", "attach_handles", "device_profiles")}
    arqs = up["extended_accelerator_requests"]
    held = {a["attach_handle_id"] for a in arqs if a["state"] != "BindStarted"}
    restarting = {a["attach_handle_id"] for a in arqs if a["state"] == "BindStarted"} - held
    return {
        "devices": {d["uuid"]: (
            d["type"], d["vendor"], d["model"], d["std_board_info"], d["vendor_board_info"],
            d["hostname"],
            "maintaining" if d["device_state"] in ("cleaning", "pending_cleaning", "error")
            else d["status"], _when(d["created_at"])) for d in up["devices"]},
        "controlpath_ids": {c["uuid"]: (uuid_of["devices"][c["device_id"]], c["cpid_type"],
                                        c["cpid_info"]) for c in up["controlpath_ids"]},
        "deployables": {d["uuid"]: (
            d["name"], d["num_accelerators"], uuid_of["devices"][d["device_id"]], d["rp_uuid"],
            d["driver_name"], d["bitstream_id"], uuid_of["deployables"].get(d["parent_id"]),
            uuid_of["deployables"].get(d["root_id"]), _when(d["created_at"]))
            for d in up["deployables"]},
        "attributes": {a["uuid"]: (uuid_of["deployables"][a["deployable_id"]], a["key"],
                                   a["value"], a["key"] != "rc" and not a["key"].startswith(
                                       "trait")) for a in up["attributes"]},
        "attach_handles": {h["uuid"]: (
            uuid_of["deployables"][h["deployable_id"]], uuid_of["controlpath_ids"][h["cpid_id"]],
            h["attach_type"], h["attach_info"],
            h["id"] in held or (bool(h["in_use"]) and h["id"] not in restarting))
            for h in up["attach_handles"]},
        "device_profiles": {p["uuid"]: (p["name"], p["description"],
                                        json.loads(p["profile_json"])["groups"])
                            for p in up["device_profiles"]},
        "accelerator_requests": {a["uuid"]: (
            a["state"], uuid_of["device_profiles"][a["device_profile_id"]],
            a["device_profile_group_id"], a["project_id"], a["hostname"], a["device_rp_uuid"],
            a["instance_uuid"],
            None if a["state"] == "BindStarted" else uuid_of["attach_handles"].get(
                a["attach_handle_id"]),
            None if a["state"] == "BindStarted" else uuid_of["deployables"].get(
                a["deployable_id"]), _when(a["created_at"])) for a in arqs},
    }


def held(db: Database) -> dict[str, dict[str, tuple]]:
    """What acceld holds, in :func:`expected`'s shape."""
    with db.read() as conn:
        ids = {t.name: dict(conn.execute(select(t.c.id, t.c.uuid)).tuples().all())
               for t in (devices, controlpath_ids, deployables, attach_handles, device_profiles)}
        rows = {t.name: [r._mapping for r in conn.execute(select(t))] for t in OURS}
    return {
        "devices": {d["uuid"]: (d["type"], d["vendor"], d["model"], d["std_board_info"],
                                d["vendor_board_info"], d["hostname"], d["status"],
                                d["created_at"]) for d in rows["devices"]},
        "controlpath_ids": {c["uuid"]: (ids["devices"][c["device_id"]], c["cpid_type"],
                                        c["cpid_info"]) for c in rows["controlpath_ids"]},
        "deployables": {d["uuid"]: (
            d["name"], d["num_accelerators"], ids["devices"][d["device_id"]], d["rp_uuid"],
            d["driver_name"], d["bitstream_id"], ids["deployables"].get(d["parent_id"]),
            ids["deployables"].get(d["root_id"]), d["created_at"]) for d in rows["deployables"]},
        "attributes": {a["uuid"]: (ids["deployables"][a["deployable_id"]], a["key"], a["value"],
                                   a["operator_owned"]) for a in rows["attributes"]},
        "attach_handles": {h["uuid"]: (ids["deployables"][h["deployable_id"]],
                                       ids["controlpath_ids"][h["cpid_id"]], h["attach_type"],
                                       h["attach_info"], h["in_use"])
                           for h in rows["attach_handles"]},
        "device_profiles": {p["uuid"]: (p["name"], p["description"],
                                        json.loads(p["profile_json"]))
                            for p in rows["device_profiles"]},
        "accelerator_requests": {a["uuid"]: (
            a["state"], ids["device_profiles"][a["device_profile_id"]],
            a["device_profile_group_id"], a["project_id"], a["hostname"], a["device_rp_uuid"],
            a["instance_uuid"], ids["attach_handles"].get(a["attach_handle_id"]),
            ids["deployables"].get(a["deployable_id"]), a["created_at"])
            for a in rows["accelerator_requests"]},
    }


def _seconds(table: dict[str, tuple]) -> dict[str, tuple]:
    """Timestamps to the second: upstream's MariaDB columns (DATETIME) hold no fraction."""
    return {k: tuple(v.replace(microsecond=0) if isinstance(v, dt.datetime) else v
                     for v in row) for k, row in table.items()}


def counts(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (*OURS, bind_jobs)}


@pytest.fixture(params=["sqlite", "mysql"])
def upstream(request, tmp_path) -> Any:
    """A filled upstream Cyborg 17 database on SQLite or MariaDB; its URL."""
    with upstream_cyborg.database(request.param, tmp_path) as url:
        upstream_cyborg.fill(url)
        yield url


def test_import_keeps_every_row_and_uuid(upstream, db, tmp_path) -> None:
    before = dump(upstream)
    lines = cyborg_import.run(upstream, db, dry_run=False)
    assert lines[0] == "upstream schema revision b47c8f2d1e3a (Cyborg 17)"
    want, have = expected(before), held(db)
    for table in want:
        assert want[table], table  # the fill wrote rows of every kind
        assert _seconds(have[table]) == _seconds(want[table]), table
    assert counts(db)["bind_jobs"] == 2  # the two binds upstream left in progress
    assert dump(upstream) == before  # upstream's database is only read
    # What is not carried over is said.
    report = "\n".join(lines)
    assert "quota_usages: 1 row(s) not carried over" in report
    assert "device_state cleaning; imported as maintaining" in report


def test_nova_reads_the_same_arqs_through_acceld(upstream, db, tmp_path) -> None:
    """What Nova's client reads for an instance (GET ?instance=): the same ARQ uuids,
    Bound, with the same attach handles, as upstream served them."""
    before = dump(upstream)
    cyborg_import.run(upstream, db, dry_run=False)
    handles = {h["id"]: h for h in before["attach_handles"]}
    client = testing.TestClient(build_app(make_conf(str(tmp_path)), db))
    bound = [a for a in before["extended_accelerator_requests"] if a["state"] == "Bound"]
    for instance in {a["instance_uuid"] for a in bound}:
        got = client.simulate_get("/v2/accelerator_requests", params={"instance": instance},
                                  headers=SERVICE)
        assert got.status_code == 200, got.text
        arqs = {a["uuid"]: a for a in got.json["arqs"]}
        for arq in (a for a in before["extended_accelerator_requests"]
                    if a["instance_uuid"] == instance):
            wire = arqs[arq["uuid"]]
            assert wire["hostname"] == arq["hostname"]
            assert wire["device_rp_uuid"] == arq["device_rp_uuid"]
            if arq["state"] == "Bound":
                handle = handles[arq["attach_handle_id"]]
                assert wire["state"] == "Bound"
                assert wire["attach_handle_uuid"] == handle["uuid"]
                assert wire["attach_handle_type"] == handle["attach_type"]
                assert wire["attach_handle_info"] == json.loads(handle["attach_info"])
            else:
                assert wire["state"] == "BindStarted"  # its bind restarts in acceld


def test_dry_run_changes_nothing(upstream, db, tmp_path, capsys) -> None:
    before = dump(upstream)
    lines = cyborg_import.run(upstream, db, dry_run=True)
    assert lines[-1] == "dry run: nothing was changed"
    assert "  accelerator requests: 9" in lines and "  attach handles: 22" in lines
    assert not any(counts(db).values())
    assert dump(upstream) == before


def test_dry_run_creates_no_sqlite_database(tmp_path) -> None:
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        upstream_cyborg.fill(url)
        target = tmp_path / "acceld" / "acceld.sqlite"
        lines = cyborg_import.run(url, Database(f"sqlite:///{target}"), dry_run=True)
    assert "acceld's database does not exist yet: the import creates it" in lines
    assert not target.exists()


def test_a_second_import_is_refused_and_changes_nothing(upstream, db) -> None:
    cyborg_import.run(upstream, db, dry_run=False)
    first = held(db), counts(db)
    with pytest.raises(cyborg_import.ImportRefused, match="already holds this import"):
        cyborg_import.run(upstream, db, dry_run=False)
    assert (held(db), counts(db)) == first
    again = cyborg_import.run(upstream, db, dry_run=True)
    assert any("the import would be refused: acceld's database already holds this import"
               in line for line in again)


def test_a_database_with_other_rows_is_refused(db, tmp_path) -> None:
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        upstream_cyborg.fill(url)
        with db.write() as conn:
            conn.execute(device_profiles.insert().values(
                uuid="00000000-0000-4000-8000-000000000001", name="acceld-own",
                profile_json="[]", created_at=dt.datetime(2026, 1, 1)))
        with pytest.raises(cyborg_import.ImportRefused,
                           match=r"not empty \(1 device_profiles\)"):
            cyborg_import.run(url, db, dry_run=False)
    assert counts(db)["device_profiles"] == 1 and counts(db)["devices"] == 0


@pytest.mark.parametrize("revision, message", [
    ("a35b4295a0e5", "upstream Cyborg schema revision a35b4295a0e5 is older than Cyborg 17's "
                     "(b47c8f2d1e3a): upgrade it with upstream's `cyborg-dbsync upgrade` first"),
    ("c0ffee123456", "schema revision c0ffee123456 is not one this import reads (upstream "
                     "Cyborg 17: b47c8f2d1e3a)"),
])
def test_other_schema_revisions_are_refused_by_name(tmp_path, revision, message) -> None:
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        upstream_cyborg.fill(url)
        path = Path(url.removeprefix("sqlite:///"))
        other = tmp_path / "other.sqlite"
        shutil.copy(path, other)
        with sqlite3.connect(other) as conn:
            conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        target = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
        for dry_run in (True, False):
            with pytest.raises(cyborg_import.ImportRefused) as refused:
                cyborg_import.run(f"sqlite:///{other}", target, dry_run=dry_run)
            assert message in str(refused.value)
        assert not (tmp_path / "acceld.sqlite").exists() or migrate.current_revision(
            target) is None


def test_an_acceld_database_is_not_taken_for_upstream(db, tmp_path) -> None:
    if not db.is_sqlite:
        pytest.skip("one backend is enough for the message")
    with pytest.raises(cyborg_import.ImportRefused, match="is acceld's own"):
        cyborg_import.run(str(db.url), Database(f"sqlite:///{tmp_path / 'x.sqlite'}"),
                          dry_run=True)


def test_conflicting_rows_stop_the_import_before_it_writes(db, tmp_path) -> None:
    """Two deployables of one name (acceld's provider names are unique): refused, listed."""
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        upstream_cyborg.fill(url)
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE deployables SET name = 'compute-02_0000:3b:00.0' "
                         "WHERE name = 'compute-02_0000:af:00.0'")
        dry = cyborg_import.run(url, db, dry_run=True)
        assert "cannot be imported (fix upstream's rows first):" in dry
        with pytest.raises(cyborg_import.ImportRefused, match="2 deployables are named"):
            cyborg_import.run(url, db, dry_run=False)
    assert not any(counts(db).values())


def test_the_command(tmp_path, capsys) -> None:
    """`acceld db import-cyborg --from URL [--dry-run]`: the report on stdout, a refusal
    as one line on stderr with exit status 1."""
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        upstream_cyborg.fill(url)
        state = str(tmp_path / "state")
        assert cli.main(["db", "import-cyborg", "--from", url, "--dry-run",
                         "--state-path", state]) == 0
        assert "dry run: nothing was changed" in capsys.readouterr().out
        assert not os.path.exists(state)  # not even the state directory
        assert cli.main(["db", "import-cyborg", "--from", url, "--state-path", state]) == 0
        assert "imported into acceld's database: device profiles 3, devices 4" in \
            capsys.readouterr().out
        assert cli.main(["db", "import-cyborg", "--from", url, "--state-path", state]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "already holds this import" in err[0]


def test_db_upgrade_on_upstreams_database_says_what_to_do(tmp_path, capsys) -> None:
    """It stopped with alembic's "Can't locate revision identified by 'b47c8f2d1e3a'"."""
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        conf = tmp_path / "acceld.conf"
        conf.write_text(f"[database]\nconnection = {url}\n")
        before = dump(url)
        assert cli.main(["db", "upgrade", "--config-file", str(conf)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["acceld db: this is upstream Cyborg's database (schema revision "
                       "b47c8f2d1e3a), not acceld's: acceld keeps its own; point [database] "
                       "connection at a new, empty database and carry this one over with "
                       "`acceld db import-cyborg --from <this URL>`"]
        assert dump(url) == before


def test_the_instances_whose_arqs_changed_since_the_import(upstream, db, tmp_path,
                                                          capsys) -> None:
    """Issue 40, the way back: `acceld db cyborg-changes --from URL` lists, by instance,
    the ARQs acceld's database no longer holds as upstream's does (deleted, created,
    bound elsewhere), which going back to upstream would show as upstream last had them.
    Upstream's database is only read."""
    from sqlalchemy import delete, insert, update

    from acceld.db import cyborg_changes

    before = dump(upstream)
    cyborg_import.run(upstream, db, dry_run=False)
    restarts = {a["uuid"] for a in before["extended_accelerator_requests"]
                if a["state"] == "BindStarted"}  # the import frees their handles
    assert {c.arq for c in cyborg_changes.changes(upstream, db)} <= restarts
    handles = {h["id"]: h["uuid"] for h in before["attach_handles"]}
    bound = sorted((a for a in before["extended_accelerator_requests"]
                    if a["state"] == "Bound"), key=lambda a: a["uuid"])
    gone, moved = bound[0], bound[1]
    newer = "7f1e0c2a-0000-4000-8000-00000000abcd"
    with db.write() as conn:  # what Nova did through acceld meanwhile
        row = dict(conn.execute(select(accelerator_requests).where(
            accelerator_requests.c.uuid == gone["uuid"])).mappings().one())
        conn.execute(delete(accelerator_requests).where(
            accelerator_requests.c.uuid == gone["uuid"]))  # its instance deleted
        conn.execute(insert(accelerator_requests).values(  # a newer one on that handle
            {**{k: v for k, v in row.items() if k != "id"},
             "uuid": "5d1c1e4e-0000-4000-8000-00000000beef", "instance_uuid": newer}))
        conn.execute(update(accelerator_requests).where(
            accelerator_requests.c.uuid == moved["uuid"]).values(
            state="Unbound", instance_uuid=None, attach_handle_id=None))

    found = cyborg_changes.changes(upstream, db)
    by_arq = {c.arq: c for c in found}
    assert by_arq[gone["uuid"]].acceld is None
    assert by_arq[gone["uuid"]].upstream.handle == handles[gone["attach_handle_id"]]
    assert by_arq["5d1c1e4e-0000-4000-8000-00000000beef"].upstream is None
    assert by_arq[moved["uuid"]].acceld.state == "Unbound"

    state = tmp_path / "state"
    url = db.url.render_as_string(hide_password=False)
    (tmp_path / "acceld.conf").write_text(f"[database]\nconnection = {url}\n")
    assert cli.main(["db", "cyborg-changes", "--from", upstream, "--config-file",
                     str(tmp_path / "acceld.conf"), "--state-path", str(state)]) == 0
    out = capsys.readouterr().out
    handle = handles[gone["attach_handle_id"]]
    assert (f"instance {gone['instance_uuid']}: ARQ {gone['uuid']} upstream Bound on handle "
            f"{handle}; in acceld: deleted") in out
    assert (f"instance {newer}: ARQ 5d1c1e4e-0000-4000-8000-00000000beef upstream: none; "
            f"in acceld: Bound on handle {handle}") in out
    assert f"instance {moved['instance_uuid']}: ARQ {moved['uuid']}" in out
    assert dump(upstream) == before  # only read
