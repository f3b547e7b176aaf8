"""``[oslo_policy]``: oslo.policy's options (its namespace lists them in the sample), with
acceld's defaults."""

from __future__ import annotations

from oslo_config import cfg


def register_opts(conf: cfg.ConfigOpts) -> None:
    from oslo_policy import opts as policy_opts

    # Only the persona defaults apply unless an operator opts back into upstream's
    # transition mode (new default OR deprecated rule) with enforce_new_defaults = False.
    # (oslo.policy 4.5 made scope enforcement permanent and 6.0 removed enforce_scope.)
    policy_opts.set_defaults(conf, policy_file="policy.yaml", enforce_new_defaults=True)


def list_opts() -> dict[str, list[cfg.Opt]]:
    return {}
