"""JSON schemas written for every reader, compiled with end anchors that mean the end.

A schema's ``pattern`` follows ECMA-262, where ``$`` (without the multiline flag) matches
only at the end of the string. Python's ``re.search``, which jsonschema uses, also lets
``$`` match before a final newline, so ``"CUSTOM_X\\n"`` passed ``^[A-Z0-9_]+$``. Schemas
that are also published (the hardware record) keep the portable ``$``; acceld compiles
them with that ``$`` rewritten to Python's ``\\Z``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from jsonschema import Draft202012Validator

# A "$" at the very end that no backslash escapes (an even run of backslashes before it).
_TRAILING_DOLLAR = re.compile(r"(?<!\\)((?:\\\\)*)\$\Z")


def python_anchored(pattern: str) -> str:
    """``pattern`` with a trailing end anchor that matches only at the end in Python."""
    return _TRAILING_DOLLAR.sub(r"\1\\Z", pattern)


def _rewrite(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                out[key] = python_anchored(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out[key] = {python_anchored(k): _rewrite(v) for k, v in value.items()}
            else:
                out[key] = _rewrite(value)
        return out
    if isinstance(node, list):
        return [_rewrite(item) for item in node]
    return node


def strict_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for ``schema`` whose anchored patterns refuse a trailing newline."""
    return Draft202012Validator(_rewrite(copy.deepcopy(schema)))
