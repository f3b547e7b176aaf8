"""Policy parity with upstream Cyborg: names, defaults, deprecated rules, sample, overrides."""

from __future__ import annotations

import json

import pytest
import yaml
from falcon import testing

from acceld import config
from acceld.api import errors
from acceld.api.context import RequestContext
from acceld.api.policy import RULES, UPSTREAM_RULE_NAMES, Policy
from acceld.cmd import samples as sample
from acceld.conf import policy as acceld_policy_opts
from tests.conftest import make_conf
from tests.helpers import ADMIN, fault, member

# Upstream Cyborg's rules and their defaults (the policy table of the wire contract, plus the
# base and legacy rules it registers).
UPSTREAM_DEFAULTS = {
    "admin_api": "role:admin",
    "project_admin_api": "role:admin and project_id:%(project_id)s",
    "project_member_api": "role:member and project_id:%(project_id)s",
    "project_reader_api": "role:reader and project_id:%(project_id)s",
    "project_manager_api": "role:manager and project_id:%(project_id)s",
    "service_api": "role:service",
    "project_member_or_admin": "rule:project_member_api or rule:admin_api",
    "project_reader_or_admin": "rule:project_reader_api or rule:admin_api",
    "project_manager_or_admin": "rule:project_manager_api or rule:admin_api",
    "project_member_or_service": "rule:project_member_api or rule:service_api",
    "public_api": "is_public_api:True",
    "allow": "@",
    "deny": "!",
    "default": "rule:admin_or_owner",
    "is_admin": "rule:admin_api",
    "admin_or_owner": "is_admin:True or project_id:%(project_id)s",
    "admin_or_user": "is_admin:True or user_id:%(user_id)s",
    "cyborg:arq:get_all": "rule:project_reader_or_admin",
    "cyborg:arq:get_one": "rule:project_reader_or_admin",
    "cyborg:arq:create": "rule:project_member_or_service",
    "cyborg:arq:delete": "rule:project_member_or_service",
    "cyborg:arq:update": "rule:project_member_or_service",
    "cyborg:device_profile:get_all": "rule:project_reader_or_admin",
    "cyborg:device_profile:get_one": "rule:project_reader_or_admin",
    "cyborg:device_profile:create": "rule:admin_api",
    "cyborg:device_profile:delete": "rule:admin_api",
    "cyborg:device:get_all": "rule:project_manager_or_admin",
    "cyborg:device:get_one": "rule:project_manager_or_admin",
    "cyborg:device:disable": "rule:admin_api",
    "cyborg:device:enable": "rule:admin_api",
    "cyborg:deployable:get_all": "rule:project_manager_or_admin",
    "cyborg:deployable:get_one": "rule:project_manager_or_admin",
    "cyborg:deployable:program": "rule:admin_api",
    "cyborg:attribute:get_all": "rule:project_manager_or_admin",
    "cyborg:attribute:get_one": "rule:project_manager_or_admin",
    "cyborg:attribute:create": "rule:admin_api",
    "cyborg:attribute:delete": "rule:admin_api",
}

# The rules each API rule replaced (upstream's DeprecatedRule check strings).
UPSTREAM_DEPRECATED = {
    "project_member_or_admin": "is_admin:True or project_id:%(project_id)s",
    "project_reader_or_admin": "is_admin:True or project_id:%(project_id)s",
    "cyborg:arq:get_all": "rule:admin_or_owner",
    "cyborg:arq:get_one": "rule:admin_or_owner",
    "cyborg:arq:create": "rule:project_member_or_admin",
    "cyborg:arq:delete": "rule:admin_or_owner",
    "cyborg:arq:update": "rule:admin_or_owner",
    "cyborg:device_profile:get_all": "rule:admin_or_owner",
    "cyborg:device_profile:get_one": "rule:admin_or_owner",
    "cyborg:device_profile:create": "rule:is_admin",
    "cyborg:device_profile:delete": "rule:admin_or_owner",
    "cyborg:device:get_all": "rule:admin_api",
    "cyborg:device:get_one": "rule:admin_api",
    "cyborg:device:disable": "rule:admin_api",
    "cyborg:device:enable": "rule:admin_api",
    "cyborg:deployable:get_all": "rule:admin_api",
    "cyborg:deployable:get_one": "rule:admin_api",
    "cyborg:deployable:program": "rule:admin_api",
    "cyborg:attribute:get_all": "rule:admin_api",
    "cyborg:attribute:get_one": "rule:admin_api",
}
LEGACY = {"public_api", "allow", "deny", "default", "is_admin", "admin_or_owner",
          "admin_or_user"}

BY_NAME = {rule.name: rule for rule in RULES}


def test_every_upstream_rule_exists_with_its_default() -> None:
    assert set(UPSTREAM_DEFAULTS) == set(UPSTREAM_RULE_NAMES)
    for name, default in UPSTREAM_DEFAULTS.items():
        assert BY_NAME[name].check_str == default, name


def test_rule_names_are_unique() -> None:
    assert len(BY_NAME) == len(RULES)


def test_deprecated_rules_match_upstream() -> None:
    with_deprecated = {r.name for r in RULES if r.deprecated_rule is not None}
    assert with_deprecated == set(UPSTREAM_DEPRECATED)
    for name, old in UPSTREAM_DEPRECATED.items():
        dep = BY_NAME[name].deprecated_rule
        assert dep.check_str == old, name
        assert dep.deprecated_reason and dep.deprecated_since, name


def test_legacy_rules_are_deprecated_for_removal() -> None:
    for name in LEGACY:
        rule = BY_NAME[name]
        assert rule.deprecated_for_removal and rule.deprecated_reason and rule.deprecated_since


def test_api_rules_are_project_scoped_and_documented() -> None:
    for rule in RULES:
        if ":" in rule.name:
            assert rule.scope_types == ["project"], rule.name
            assert rule.operations, rule.name


def test_sample_lists_every_rule_and_parses_when_uncommented() -> None:
    text = sample.policy_sample()
    uncommented = "\n".join(line[1:] for line in text.splitlines()
                            if line.startswith('#"'))
    parsed = yaml.safe_load(uncommented)
    assert parsed == {rule.name: rule.check_str for rule in RULES}
    # oslo.policy's generator wraps comments at 70 columns.
    flat = " ".join(line[2:] if line.startswith("# ") else line for line in text.splitlines())
    for name, old in UPSTREAM_DEPRECATED.items():
        old_name = BY_NAME[name].deprecated_rule.name
        assert f'"{old_name}":"{old}" has been deprecated since' in flat


def test_cli_prints_the_sample(capsys) -> None:  # type: ignore[no-untyped-def]
    from acceld.cmd.main import main

    assert main(["policy", "sample"]) == 0
    assert capsys.readouterr().out == sample.policy_sample()


def _ctx(project: str, *roles: str, service: tuple[str, ...] = (),
         system_scope: str | None = None) -> RequestContext:
    return RequestContext(user_id=f"u-{project}", project_id=project, roles=list(roles),
                          service_roles=list(service), system_scope=system_scope)


def test_new_defaults_only_by_default(tmp_path) -> None:
    policy = Policy(make_conf(str(tmp_path)))
    reader = _ctx("p1", "reader")
    # The legacy owner rule would let any project user delete ARQs and device profiles.
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:arq:delete", reader)
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:device_profile:delete", _ctx("p1", "member", "reader"))
    policy.authorize("cyborg:arq:get_all", reader)


@pytest.mark.filterwarnings("ignore:Policy .* was deprecated:UserWarning")
def test_upstream_transition_mode_honours_the_deprecated_rules(tmp_path) -> None:
    conf = make_conf(str(tmp_path), oslo_policy__enforce_new_defaults=False)
    policy = Policy(conf)
    reader = _ctx("p1", "reader")
    policy.authorize("cyborg:arq:delete", reader)  # new default OR rule:admin_or_owner
    # OR rule:project_member_or_admin, itself bridged to admin_or_owner.
    policy.authorize("cyborg:arq:create", reader)
    member = _ctx("p1", "member", "reader")
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:device_profile:create", member)  # OR rule:is_admin
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:device:get_all", member)  # OR rule:admin_api
    policy.authorize("cyborg:device:get_all", _ctx("p1", "manager", "member", "reader"))


def test_system_scoped_tokens_are_refused(tmp_path) -> None:
    policy = Policy(make_conf(str(tmp_path)))
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:device_profile:get_all",
                         _ctx("p1", "admin", "reader", system_scope="all"))
    policy.authorize("cyborg:device_profile:get_all", _ctx("p1", "admin", "reader"))


def test_service_role_passes_the_member_or_service_rules(tmp_path) -> None:
    policy = Policy(make_conf(str(tmp_path)))
    nova = _ctx("service", "service")
    for rule in ("cyborg:arq:create", "cyborg:arq:update", "cyborg:arq:delete"):
        policy.authorize(rule, nova)
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:arq:get_all", nova)


PROFILE = [{"name": "override-dp", "groups": [{"resources:FPGA": "1"}]}]


def _client(conf, sqlite_db) -> testing.TestClient:  # type: ignore[no-untyped-def]
    from acceld.api.app import build_app

    return testing.TestClient(build_app(conf, sqlite_db))


def test_policy_file_in_the_config_dir_overrides_defaults(tmp_path, sqlite_db) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "acceld.conf").write_text(
        f"[DEFAULT]\nstate_path = {tmp_path}\n[oslo_policy]\npolicy_file = custom-policy.yaml\n")
    (conf_dir / "custom-policy.yaml").write_text(
        '"cyborg:device_profile:create": "rule:project_member_api"\n'
        '"cyborg:device_profile:get_all": "!"\n')
    from oslo_config import cfg

    conf = config.load(config_files=[str(conf_dir / "acceld.conf")], conf=cfg.ConfigOpts())
    client = _client(conf, sqlite_db)
    created = client.simulate_post("/v2/device_profiles", json=PROFILE, headers=member("p1"))
    assert created.status_code == 201, created.text
    listed = client.simulate_get("/v2/device_profiles", headers=ADMIN)
    assert listed.status_code == 403
    assert fault(listed) == "Policy doesn't allow cyborg:device_profile:get_all to be performed."


def test_without_a_policy_file_the_defaults_apply(tmp_path, sqlite_db) -> None:
    client = _client(make_conf(str(tmp_path)), sqlite_db)
    denied = client.simulate_post("/v2/device_profiles", json=PROFILE, headers=member("p1"))
    assert denied.status_code == 403
    assert "cyborg:device_profile:create" in fault(denied)
    assert json.loads(denied.json["error_message"])["faultcode"] == "Client"


def test_tokens_without_a_project_are_refused_before_any_rule(tmp_path) -> None:
    """Domain- and system-scoped tokens reach no rule of acceld's (the per-project filters
    would otherwise see no project), with a message that says what to use instead."""
    policy = Policy(make_conf(str(tmp_path)))
    domain_admin = RequestContext(user_id="u", project_id=None, roles=["admin", "reader"],
                                  domain_id="default")
    system_admin = RequestContext(user_id="u", project_id=None, roles=["admin", "reader"],
                                  system_scope="all")
    unscoped = RequestContext(user_id="u", project_id=None, roles=["admin"])
    for ctx, scope in ((domain_admin, "domain"), (system_admin, "system"),
                       (unscoped, "unscoped")):
        assert not ctx.is_admin
        assert not policy.allows("cyborg:arq:get_all", ctx)
        with pytest.raises(errors.Forbidden, match=f"with a {scope}-scoped token"):
            policy.authorize("cyborg:arq:get_all", ctx)
    policy.authorize("cyborg:arq:get_all", _ctx("p1", "admin"))


def test_no_removed_oslo_policy_option_is_set(monkeypatch) -> None:
    """Defaults are set only for options oslo.policy still has (enforce_scope is gone:
    setting it silently did nothing)."""
    from oslo_config import cfg
    from oslo_policy import opts as policy_opts

    given: dict = {}
    real = policy_opts.set_defaults

    def recording(conf, policy_file=None, **kwargs):  # type: ignore[no-untyped-def]
        given.update(kwargs)
        return real(conf, policy_file=policy_file, **kwargs)

    monkeypatch.setattr(policy_opts, "set_defaults", recording)
    conf = cfg.ConfigOpts()
    acceld_policy_opts.register_opts(conf)
    assert given, "acceld sets oslo.policy defaults through set_defaults"
    assert set(given) <= {opt.name for opt in policy_opts._options}
    assert conf.oslo_policy.enforce_new_defaults is True


def test_policy_credentials_are_oslo_contexts() -> None:
    """The same keys as oslo.context's to_policy_values, so operator rules mean the same."""
    from oslo_context import context as oslo_context

    ours = set(RequestContext(user_id="u", project_id="p").policy_credentials())
    theirs = set(oslo_context.RequestContext().to_policy_values())
    assert theirs <= ours
