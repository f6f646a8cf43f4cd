"""A fake host's files that misbehave on purpose: the transfer and fetch tests' flaky link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from handoff.testing.local import LocalFiles


class CutFiles(LocalFiles):
    """A host whose connection drops after `cut` bytes of a read; counts bytes sent."""

    def __init__(self, home: Path, cut: int | None = None) -> None:
        super().__init__(home)
        self.cut = cut
        self.sent = 0

    def read_chunks(self, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        for chunk in super().read_chunks(path, offset, end):
            if self.cut is not None and self.sent + len(chunk) > self.cut:
                keep = self.cut - self.sent
                self.sent += keep
                yield chunk[:keep]
                raise OSError("connection dropped")
            self.sent += len(chunk)
            yield chunk
