"""Check an INI file as oslo.config reads it, against the options of some oslo.config
namespaces: unknown sections and options, values their type refuses, and ``# comments``
written after a value (oslo.config keeps them as part of the value).

It imports only oslo.config and keystoneauth1, so that the same file runs under acceld's
interpreter and under Nova's (``.nova/venv``, for nova.conf snippets):

    python tests/support/ini_check.py FILE NAMESPACE [NAMESPACE ...]

prints a JSON list of problems, one string each (empty when the file means what it says).
"""

from __future__ import annotations

import copy
import json
import re
import sys

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg
from oslo_config import generator

# A '#' or ';' after whitespace inside a value: oslo.config's parser has no inline comments.
INLINE_COMMENT = re.compile(r"\s[#;]")


def _register(conf: cfg.ConfigOpts, group: str, opts: list[cfg.Opt]) -> None:
    """Register ``opts`` in ``group``, none required: a snippet shows some options only."""
    for opt in opts:
        if opt.required:
            opt = copy.copy(opt)
            opt.required = False
        try:
            conf.register_opt(opt, group=None if group == "DEFAULT" else group)
        except cfg.DuplicateOptError:
            pass  # one option listed by two namespaces (or twice by one): either will do


def _auth_plugin_opts(auth_type: str) -> list[cfg.Opt]:
    """The options an auth plugin adds to its section once ``auth_type`` names it."""
    return ks_loading.get_auth_plugin_conf_options(auth_type)


def _parse(path: str) -> tuple[dict[str, dict[str, list[str]]], list[str]]:
    """The sections oslo.config's own parser reads from ``path``, and what is wrong with
    their text whatever the options: a parse error, a comment after a value."""
    sections: dict[str, dict[str, list[str]]] = {}
    try:
        cfg.ConfigParser(path, sections).parse()
    except cfg.ParseError as exc:
        return {}, [f"not parsed by oslo.config: {exc}"]
    out = []
    for section, values in sections.items():
        for name, raw in values.items():
            out += [f"[{section}] {name} = {value!r}: oslo.config has no inline comments, "
                    "the text after '#' would be part of the value"
                    for value in raw if INLINE_COMMENT.search(value)]
    return sections, out


def syntax_problems(path: str) -> list[str]:
    """What is wrong with ``path`` as an INI file, options aside (a third party's groups)."""
    return _parse(path)[1]


def problems(path: str, namespaces: list[str]) -> list[str]:
    """What is wrong with the INI file ``path`` for a service with ``namespaces``' options."""
    sections, out = _parse(path)
    if not sections:
        return out
    conf = cfg.ConfigOpts()
    known: dict[str, set[str]] = {}
    for _namespace, listing in generator._list_opts(namespaces):
        for group, opts in listing:
            group = str(group or "DEFAULT")
            _register(conf, group, opts)
            known.setdefault(group, set()).update(o.dest for o in opts)
    for section, values in sections.items():
        if section not in known:
            out.append(f"[{section}]: no such section")
            continue
        auth_type = values.get("auth_type", [None])[-1]
        if auth_type:
            try:
                plugin_opts = _auth_plugin_opts(auth_type)
            except Exception as exc:  # noqa: BLE001 - keystoneauth's own errors vary by version
                out.append(f"[{section}] auth_type = {auth_type}: {exc}")
                plugin_opts = []
            _register(conf, section, plugin_opts)
            known[section].update(o.dest for o in plugin_opts)
        out += [f"[{section}] {name}: no such option" for name in values
                if name.replace("-", "_") not in known[section]]
    if out:
        return out
    conf([], project="snippet", default_config_files=[path], default_config_dirs=[])
    for section, values in sections.items():
        group = conf if section == "DEFAULT" else conf[section]
        for name in values:
            try:
                group[name.replace("-", "_")]
            except (cfg.ConfigFileValueError, ValueError) as exc:
                out.append(f"[{section}] {name}: {exc}")
    return out


if __name__ == "__main__":
    print(json.dumps(problems(sys.argv[1], sys.argv[2:])))
