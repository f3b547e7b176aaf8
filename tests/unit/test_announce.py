"""A service's announcement line reaches its stream in one write: log lines of the same
processes share the stream, and one landing between the URL and its newline corrupted the
URL the launcher read (seen with PYTHONUNBUFFERED=1 under parallel test workers)."""

from __future__ import annotations

import io

from acceld.runtime import lifecycle


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_an_announcement_is_one_write(monkeypatch):
    out = _Writes()
    monkeypatch.setattr("sys.stdout", out)
    lifecycle.announce("acceld api: http://127.0.0.1:6666/accelerator/v2")
    assert out.calls == ["acceld api: http://127.0.0.1:6666/accelerator/v2\n"]
