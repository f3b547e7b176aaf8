"""/v2/device_profiles: the contract, every validation rule, on every backend."""

import uuid

import pytest
from sqlalchemy import func, select

from acceld.db.models import device_profiles
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member, version

URL = "/accelerator/v2/device_profiles"
FPGA_GROUP = {"resources:FPGA": "1", "trait:CUSTOM_FPGA_INTEL": "required"}


def create(client, name="dp-a", groups=None, headers=None, **extra):
    body = [{"name": name, "groups": groups or [FPGA_GROUP], **extra}]
    return client.simulate_post(URL, json=body, headers=headers)


def profile_count(db) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(device_profiles)).scalar_one()


def test_create_returns_bare_profile(client):
    result = create(client, "dp-b", [FPGA_GROUP, {"resources:PGPU": "2"}],
                    description="two groups")
    assert result.status_code == 201
    body = result.json
    assert set(body) == {"uuid", "name", "description", "groups", "created_at", "updated_at",
                         "links"}
    assert body["name"] == "dp-b"
    assert body["description"] == "two groups"
    assert body["groups"] == [FPGA_GROUP, {"resources:PGPU": "2"}]
    assert body["updated_at"] is None
    assert body["created_at"].endswith("+00:00")
    assert body["links"] == [{"href": f"http://falconframework.org/accelerator/v2/"
                                      f"device_profiles/{body['uuid']}", "rel": "self"}]
    uuid.UUID(body["uuid"])


def test_create_with_given_uuid(client):
    given = str(uuid.uuid4())
    result = create(client, uuid=given)
    assert result.status_code == 201
    assert result.json["uuid"] == given


def test_create_strips_spaces_around_keys(client):
    result = create(client, groups=[{" resources:FPGA ": "1", "trait:CUSTOM_X ": " required"}])
    assert result.status_code == 201
    assert result.json["groups"] == [{"resources:FPGA": "1", "trait:CUSTOM_X": "required"}]


def test_accel_keys_are_free_form(client):
    group = {"resources:FPGA": "1", "accel:bitstream_id": str(uuid.uuid4()),
             "accel:function_id": "abc"}
    assert create(client, groups=[group]).status_code == 201


def test_duplicate_name_is_409(client, db):
    assert create(client).status_code == 201
    result = create(client)
    assert result.status_code == 409
    assert "dp-a" in fault(result)
    assert profile_count(db) == 1


def test_duplicate_uuid_is_409(client, db):
    given = str(uuid.uuid4())
    assert create(client, "one", uuid=given).status_code == 201
    result = create(client, "two", uuid=given)
    assert result.status_code == 409
    assert given in fault(result)
    assert profile_count(db) == 1


@pytest.mark.parametrize("body, words", [
    ({"name": "x", "groups": [FPGA_GROUP]}, "array"),
    ([], "non-empty"),
    ([{"name": "a", "groups": [FPGA_GROUP]}, {"name": "b", "groups": [FPGA_GROUP]}], "long"),
    ([{"groups": [FPGA_GROUP]}], "'name' is a required property"),
    ([{"name": "x"}], "'groups' is a required property"),
    ([{"name": "", "groups": [FPGA_GROUP]}], "name"),
    ([{"name": "bad name", "groups": [FPGA_GROUP]}], "does not match"),
    ([{"name": "x/y", "groups": [FPGA_GROUP]}], "does not match"),
    ([{"name": "n" * 256, "groups": [FPGA_GROUP]}], "too long"),
    ([{"name": 7, "groups": [FPGA_GROUP]}], "not of type 'string'"),
    ([{"name": "x", "groups": []}], "groups"),
    ([{"name": "x", "groups": [{}]}], "groups/0"),
    ([{"name": "x", "groups": "resources:FPGA=1"}], "not of type 'array'"),
    ([{"name": "x", "groups": [["resources:FPGA", "1"]]}], "not of type 'object'"),
    ([{"name": "x", "groups": [{"resources:FPGA": 1}]}], "not of type 'string'"),
    ([{"name": "x", "groups": [{"resources:FPGA": "0"}]}], "does not match"),
    ([{"name": "x", "groups": [{"resources:FPGA": "-1"}]}], "does not match"),
    ([{"name": "x", "groups": [{"resources:FPGA": "one"}]}], "does not match"),
    ([{"name": "x", "groups": [{"resources:BOGUS": "1"}]}], "CUSTOM_"),
    ([{"name": "x", "groups": [{"resources:fpga": "1"}]}], "upper case"),
    ([{"name": "x", "groups": [{"resources:": "1"}]}], "nothing after"),
    ([{"name": "x", "groups": [{"trait:CUSTOM_A": "preferred"}]}], "is not one of"),
    ([{"name": "x", "groups": [{"color": "red"}]}], "must start with"),
    ([{"name": "x", "groups": [FPGA_GROUP], "extra": 1}], "'extra' was unexpected"),
    ([{"name": "x", "groups": [FPGA_GROUP], "uuid": "not-a-uuid"}], "uuid"),
    ([{"name": "x", "groups": [FPGA_GROUP], "description": 5}], "description"),
])
def test_create_rejects_bad_input(client, db, body, words):
    result = client.simulate_post(URL, json=body)
    assert result.status_code == 400, result.text
    assert words in fault(result)
    assert profile_count(db) == 0


def test_create_rejects_malformed_json(client, db):
    result = client.simulate_post(URL, body=b'[{"name": "x", ',
                                  headers={"Content-Type": "application/json"})
    assert result.status_code == 400
    assert "Malformed JSON" in fault(result)
    assert profile_count(db) == 0


def test_create_rejects_empty_body(client):
    result = client.simulate_post(URL, body=b"", headers={"Content-Type": "application/json"})
    assert result.status_code == 400
    assert "empty" in fault(result)


def test_create_needs_admin(client, db):
    result = create(client, headers=member())
    assert result.status_code == 403
    assert "cyborg:device_profile:create" in fault(result)
    assert profile_count(db) == 0


def test_list_and_filter_by_name(client):
    for name in ("a", "b", "c"):
        create(client, name)
    result = client.simulate_get(URL)
    assert result.status_code == 200
    assert [p["name"] for p in result.json["device_profiles"]] == ["a", "b", "c"]
    filtered = client.simulate_get(URL, params={"name": "a,c"}).json["device_profiles"]
    assert [p["name"] for p in filtered] == ["a", "c"]
    assert client.simulate_get(URL, params={"name": "zzz"}).json == {"device_profiles": []}


def test_list_rejects_unknown_query_parameter(client):
    result = client.simulate_get(URL, params={"colour": "red"})
    assert result.status_code == 400
    assert "colour" in fault(result)


def test_list_runs_constant_queries(client, db):
    with db.write() as conn:
        conn.execute(device_profiles.insert(), [
            {"uuid": str(uuid.uuid4()), "name": f"dp-{i}", "profile_json": '[{"resources:FPGA": "1"}]'}
            for i in range(1000)])
    with count_queries(db) as statements:
        result = client.simulate_get(URL)
    assert result.status_code == 200
    assert len(result.json["device_profiles"]) == 1000
    assert len(statements) == 1


def test_show_by_uuid_at_any_version(client):
    created = create(client).json
    for v in ("2.0", "2.2"):
        result = client.simulate_get(f"{URL}/{created['uuid']}", headers=version(v))
        assert result.status_code == 200
        assert result.json["device_profile"]["name"] == "dp-a"
        assert result.json["device_profile"]["groups"] == [FPGA_GROUP]


def test_show_by_name_needs_2_2(client):
    create(client)
    result = client.simulate_get(f"{URL}/dp-a", headers=version("2.1"))
    assert result.status_code == 406
    assert fault(result) == ("Request not acceptable. The minimal required API version "
                             "should be 2.2")
    result = client.simulate_get(f"{URL}/dp-a", headers=version("2.2"))
    assert result.status_code == 200
    assert result.json["device_profile"]["name"] == "dp-a"


def test_show_unknown_is_404(client):
    assert client.simulate_get(f"{URL}/{uuid.uuid4()}").status_code == 404
    assert client.simulate_get(f"{URL}/nope", headers=version("2.2")).status_code == 404


def test_show_as_reader_of_another_project(client):
    created = create(client).json
    result = client.simulate_get(f"{URL}/{created['uuid']}", headers=member("p9"))
    assert result.status_code == 200


@pytest.mark.parametrize("how", ["uuid", "name"])
def test_delete_one(client, db, how):
    created = create(client).json
    result = client.simulate_delete(f"{URL}/{created[how]}")
    assert result.status_code == 204
    assert result.text == ""
    assert profile_count(db) == 0


def test_delete_comma_list_in_path(client, db):
    for name in ("a", "b", "c"):
        create(client, name)
    assert client.simulate_delete(f"{URL}/a,b").status_code == 204
    assert [p["name"] for p in client.simulate_get(URL).json["device_profiles"]] == ["c"]


def test_delete_by_value_query(client, db):
    for name in ("a", "b"):
        create(client, name)
    assert client.simulate_delete(URL, params={"value": "a,b"}).status_code == 204
    assert profile_count(db) == 0


def test_delete_is_all_or_nothing(client, db):
    create(client, "a")
    result = client.simulate_delete(f"{URL}/a,missing")
    assert result.status_code == 404
    assert "missing" in fault(result)
    assert profile_count(db) == 1


def test_delete_without_names_is_400(client):
    assert client.simulate_delete(URL).status_code == 400


def test_delete_needs_admin(client, db):
    create(client)
    assert client.simulate_delete(f"{URL}/dp-a", headers=member()).status_code == 403
    assert profile_count(db) == 1


def test_served_at_root_too(client):
    create(client)
    assert len(client.simulate_get("/v2/device_profiles").json["device_profiles"]) == 1


def test_admin_headers_honoured(client):
    assert create(client, headers=ADMIN).status_code == 201


def test_nul_characters_are_400_and_change_nothing(client, db):
    """PostgreSQL refuses NUL in text; each of these was a 500 there."""
    for extra in ({"description": "a\u0000b"},
                  {"groups": [{"resources:FPGA": "1", "accel:x": "a\u0000"}]}):
        result = create(client, "dp-nul", headers=ADMIN, **extra)
        assert result.status_code == 400, result.text
        assert "NUL" in fault(result)
    assert profile_count(db) == 0
    assert create(client, "dp-a", headers=ADMIN).status_code == 201
    for method, path, query in [("GET", URL, "name=dp-a%00"), ("DELETE", URL, "value=%00"),
                                ("GET", f"{URL}/dp-a%00", ""), ("DELETE", f"{URL}/dp-a%00", "")]:
        result = client.simulate_request(method, path, query_string=query,
                                         headers={**ADMIN, **version("2.2")})
        assert result.status_code == 400, (method, path, query, result.text)
    assert profile_count(db) == 1


def test_escaped_backslash_u0000_is_plain_text(client, db):
    """Only a real NUL is refused: the six characters \\u0000 are an ordinary description."""
    result = create(client, headers=ADMIN, description="\\u0000")
    assert result.status_code == 201
    assert result.json["description"] == "\\u0000"


def test_keys_equal_once_stripped_are_400(client, db):
    """Was a 201 keeping one of the two values (the other silently dropped)."""
    result = create(client, "dp-dup", headers=ADMIN,
                    groups=[{"resources:FPGA": "1", " resources:FPGA": "2"}])
    assert result.status_code == 400
    assert "groups/0" in fault(result)
    assert profile_count(db) == 0
