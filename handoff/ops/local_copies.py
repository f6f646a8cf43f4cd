"""What the workstation already holds of a job's files, for `fab fetch` to skip or resume:
complete copies and what cut downloads left (handoff.host.transfer.partial), and the probe
hashes of their prefixes that the host is asked to match (fetch_list.probe_sha256).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from handoff.host.remote_code import fetch_list
from handoff.host.transfer import completes, is_partial, partial

APPEND_ONLY_SUFFIXES = (".jsonl",)
APPEND_ONLY_NAMES = ("log",)


def append_only(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(APPEND_ONLY_SUFFIXES) or name in APPEND_ONLY_NAMES


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Have:
    """What the workstation holds of one file: a complete copy, and/or what a cut
    download left (transfer.partial), by size."""

    final: int | None = None
    part: int | None = None

    def prefix(self, rel: str) -> tuple[str, int] | None:
        """Which local bytes the host is asked to prove are a prefix of its file: an
        append-only file's copy (it may have grown), else a cut download's part."""
        if self.final and append_only(rel):
            return "final", self.final
        if self.part:
            return "part", self.part
        return None


def local_copies(folder: Path) -> dict[str, Have]:
    """What the workstation already holds of a job: relative path -> Have."""
    if not folder.is_dir():
        return {}
    final: dict[str, int] = {}
    part: dict[str, int] = {}
    for p in folder.rglob("*"):
        if p.is_symlink() or not p.is_file():
            continue
        if not is_partial(p.name):
            final[p.relative_to(folder).as_posix()] = p.stat().st_size
        elif (of := completes(p)) is not None:
            part[of.relative_to(folder).as_posix()] = p.stat().st_size
    return {rel: Have(final.get(rel), part.get(rel)) for rel in final.keys() | part.keys()}


def asked(have: dict[str, Have]) -> dict[str, int]:
    """The prefixes the host is asked to hash: relative path -> length (see Have.prefix)."""
    return {rel: which[1] for rel, h in have.items() if (which := h.prefix(rel))}


def prefix_path(local: Path, which: str) -> Path:
    return local if which == "final" else partial(local)


def local_hashes(local_dir: Path, have: dict[str, Have]) -> dict[str, str]:
    """The probe sha256 of each local prefix the host is asked about (see Have.prefix and
    fetch_list.probe_sha256: 2 MiB hashed per file at most)."""
    out = {}
    for rel, h in have.items():
        which = h.prefix(rel)
        if which is not None:
            try:
                digest = fetch_list.probe_sha256(str(prefix_path(local_dir / rel, which[0])), which[1])
            except OSError:
                digest = None
            if digest is not None:
                out[rel] = digest
    return out
