"""Releases: the payload as one content-addressed zipapp, switched in atomically.

`payload.pyz` is a stdlib zipapp with reproducible bytes: entries sorted, fixed
timestamps and permissions, stored uncompressed (zlib output can differ between
builds of zlib; stored bytes cannot). Its sha256 names the release. Upload goes to
a temp name in the release folder and is renamed into place; only then does
`current` change, by renaming a fresh symlink over it. A dropped connection at any
point leaves `current` pointing at a complete release.
"""

from __future__ import annotations

import hashlib
import io
import secrets as pysecrets
import shlex
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import paramiko

from handoff.errors import RemoteError
from handoff.plan import Skipped
from handoff.remote import Session
from handoff.state import REPO_ROOT
from handoff.verify import Facts

PAYLOAD_DIR = REPO_ROOT / "payload"
KEEP_RELEASES = 3
MAIN = "from payload.cli import main\nraise SystemExit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Release:
    data: bytes
    sha256: str

    @property
    def sha12(self) -> str:
        return self.sha256[:12]

    @property
    def size(self) -> int:
        return len(self.data)


def _entry(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = (stat.S_IFREG | 0o644) << 16
    info.create_system = 3  # unix, whatever the building OS
    info.compress_type = zipfile.ZIP_STORED
    zf.writestr(info, data)


def build_bytes(payload_dir: Path = PAYLOAD_DIR) -> bytes:
    files = sorted(
        p for p in payload_dir.rglob("*.py")
        if "__pycache__" not in p.parts and not any(part.startswith(".") for part in p.parts)
    )
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w") as zf:
        _entry(zf, "__main__.py", MAIN.encode())
        for path in files:
            rel = path.relative_to(payload_dir.parent).as_posix()
            _entry(zf, rel, path.read_bytes())
    return buf.getvalue()


@lru_cache(maxsize=1)
def _cached(payload_dir: Path, stamp: tuple[tuple[str, float, int], ...]) -> Release:
    data = build_bytes(payload_dir)
    return Release(data, hashlib.sha256(data).hexdigest())


def build(payload_dir: Path = PAYLOAD_DIR) -> Release:
    """The release for the payload as it is now (rebuilt only when a file changed)."""
    stamp = tuple(
        (str(p), p.stat().st_mtime, p.stat().st_size)
        for p in sorted(payload_dir.rglob("*.py")) if "__pycache__" not in p.parts
    )
    return _cached(payload_dir, stamp)


def release_dir(session: Session, release: Release) -> str:
    return f"{session.remote_dir}/releases/{release.sha12}"


def has_release(facts: Facts, release: Release) -> bool:
    return any(r["name"] == release.sha12 and r["size"] == release.size for r in facts.releases)


def current_is(facts: Facts, release: Release) -> bool:
    cur = facts.current
    return bool(cur) and cur.rstrip("/").endswith(f"releases/{release.sha12}")  # type: ignore[union-attr]


def parents(path: str) -> list[str]:
    """`path` and each folder above it (`~/a/b` -> `~/a/b`, `~/a`, `~`): what a deploy asks
    the probe about, so creating folders later needs no stat round trips."""
    out = []
    while path not in ("", "/", "~"):
        out.append(path)
        path = path.rsplit("/", 1)[0] if "/" in path else ""
    return out + (["~"] if path == "~" else [])


def mkdirs(sftp: paramiko.SFTPClient, path: str, mode: int = 0o755,
           known: Mapping[str, bool] | None = None) -> bool:
    """mkdir -p over SFTP; True when it created `path` itself.

    `known` (absolute path -> is a directory, from the probe) saves the stat of each level
    it covers; other levels cost one stat. A level created meanwhile by a concurrent run
    is fine (its mkdir fails, a stat confirms it).
    """
    known = known or {}
    missing = []
    p = path
    while p not in ("", "/"):
        if known.get(p) is True:
            break
        if known.get(p) is None:
            try:
                sftp.stat(p)
                break
            except FileNotFoundError:
                pass
        missing.append(p)
        p = p.rsplit("/", 1)[0]
    for d in reversed(missing):
        try:
            sftp.mkdir(d, mode)
        except OSError:
            sftp.stat(d)  # created meanwhile by a concurrent run: fine; else this raises
    return bool(missing)


def upload_atomic(sftp: paramiko.SFTPClient, data: bytes, final: str, mode: int = 0o644) -> None:
    """Write to a temp name in the same folder, then rename: readers never see a partial file."""
    folder, name = final.rsplit("/", 1)
    tmp = f"{folder}/.{name}.tmp-{pysecrets.token_hex(6)}"
    try:
        with sftp.open(tmp, "wbx") as f:
            f.set_pipelined(True)
            f.chmod(mode)
            for i in range(0, len(data), 32768):
                f.write(data[i : i + 32768])
        sftp.posix_rename(tmp, final)
    except BaseException:
        try:
            sftp.remove(tmp)
        except Exception:
            pass
        raise


def _remove_leftovers(sftp: paramiko.SFTPClient, folder: str, prefix: str) -> None:
    """Temp names left by an earlier run whose connection dropped mid-step."""
    for name in sftp.listdir(folder):
        if name.startswith(prefix):
            try:
                sftp.remove(f"{folder}/{name}")
            except OSError:
                pass


def upload(session: Session, facts: Facts, release: Release) -> str:
    if has_release(facts, release):
        return Skipped(f"release {release.sha12} already on the host")
    folder = release_dir(session, release)
    try:
        created = mkdirs(session.sftp, folder, known=facts.dirs)
        upload_atomic(session.sftp, release.data, f"{folder}/payload.pyz")
        if not created:  # a folder made just now holds no earlier run's temp files
            _remove_leftovers(session.sftp, folder, ".payload.pyz.tmp-")
    except OSError as exc:
        raise RemoteError(f"{session.label}: uploading release {release.sha12} to {folder} failed: {exc}") from None
    return f"uploaded release {release.sha12} ({release.size / 1024:.0f} KiB)"


def switch(session: Session, facts: Facts, release: Release) -> str:
    if current_is(facts, release):
        return Skipped(f"current already → {release.sha12}")
    rd = session.remote_dir
    tmp = f"{rd}/.current.tmp-{pysecrets.token_hex(6)}"
    try:
        # OpenSSH's sftp-server takes SYMLINK args as (target, link), which is the order
        # paramiko sends. rename(2) over the old link swaps it in one step (`mv -T`).
        session.sftp.symlink(f"releases/{release.sha12}", tmp)
        session.sftp.posix_rename(tmp, f"{rd}/current")
        _remove_leftovers(session.sftp, rd, ".current.tmp-")
    except OSError as exc:
        try:
            session.sftp.remove(tmp)
        except Exception:
            pass
        raise RemoteError(f"{session.label}: switching {rd}/current failed: {exc}") from None
    return f"current → releases/{release.sha12}"


def prune(session: Session, facts: Facts, release: Release, keep: int = KEEP_RELEASES) -> str:
    names = [r["name"] for r in facts.releases if r["name"] != release.sha12]
    keep_old = keep - 1  # the new release is one of the `keep`; releases are oldest first
    doomed = names[: max(0, len(names) - keep_old)]
    if not doomed:
        return Skipped("nothing to prune")
    paths = " ".join(shlex.quote(f"{session.remote_dir}/releases/{n}") for n in doomed)
    session.check(f"rm -rf -- {paths}", "pruning old releases")
    return f"pruned {len(doomed)} old release(s)"
