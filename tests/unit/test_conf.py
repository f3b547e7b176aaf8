"""acceld.conf: one module per option group, each listing its options for the sample;
a module without ``list_opts`` is refused; every option is registered on each
ConfigOpts of its own (no default or override shared between two)."""

from __future__ import annotations

import sys
import types

import pytest
from oslo_config import cfg

import acceld.conf
from acceld.conf import opts


def test_every_module_lists_options_and_registers_them() -> None:
    from keystoneauth1 import loading as ks_loading

    # keystoneauth registers an auth plugin's options (auth_url, username, ...) as it
    # loads the plugin [<group>] auth_type names.
    plugin = {o.dest for o in ks_loading.get_auth_plugin_conf_options("password")}
    conf = cfg.ConfigOpts()
    acceld.conf.register_opts(conf)
    listed = opts.list_opts()
    assert len(opts._modules()) >= 15
    for group, group_opts in listed:
        name = getattr(group, "name", group)
        for opt in group_opts:
            # oslo.privsep registers these as a context starts, oslo.log this one as it
            # first reports a deprecation.
            if (name.startswith("privsep_") or opt.dest == "fatal_deprecations"
                    or name in ("nova", "placement", "glance") and opt.dest in plugin):
                continue
            section = conf if name == "DEFAULT" else conf[name]
            assert opt.dest in section, (name, opt.dest)


def test_a_module_without_list_opts_is_refused(monkeypatch) -> None:
    bare = types.ModuleType("acceld.conf.bare")
    monkeypatch.setitem(sys.modules, "acceld.conf.bare", bare)
    monkeypatch.setattr(opts, "_modules", lambda: ["api", "bare"])
    with pytest.raises(RuntimeError, match="acceld.conf.bare has no list_opts"):
        opts.list_opts()


def _loaded() -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    acceld.conf.register_opts(conf)
    conf([], project="acceld", default_config_files=[], default_config_dirs=[])
    return conf


def test_two_configurations_share_no_default_nor_override() -> None:
    """oslo.config copies a registered OptGroup shallowly: registered by object, the
    group's options (their defaults and overrides) would be shared by every ConfigOpts,
    and one test's override would reach the next one's configuration."""
    pristine = _loaded()
    first = _loaded()
    checked = []
    for group, group_opts in opts.list_opts():
        name = getattr(group, "name", group)
        strings = [o.dest for o in group_opts if type(o) is cfg.StrOpt
                   and not o.type.choices and not o.type.regex]
        if name == "DEFAULT" or name.startswith("privsep_") or not strings:
            continue
        for dest in {strings[0], strings[-1]}:
            checked.append((name, dest, pristine[name][dest]))
        first.set_default(strings[-1], "changed", group=name)
        first.set_override(strings[0], "changed", group=name)
    second = _loaded()
    for name, dest, default in checked:
        assert first[name][dest] == "changed"
        assert second[name][dest] == default, (name, dest)
    assert len(checked) >= 14, checked
