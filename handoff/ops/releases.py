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
import shlex
import stat
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import payload
from handoff import defaults
from handoff.config.layout import RemoteLayout, parents
from handoff.errors import RemoteError
from handoff.host.facts import Facts
from handoff.host.targets import Target
from handoff.host.transfer import mkdirs, remove_leftovers, temp_name, temp_prefix, upload_atomic
from handoff.run.plan import HostContext, Skipped, Step

# The payload package as installed (a checkout's payload/ when installed editable): the
# release is built from what `import payload` finds, never from a path in a checkout.
PAYLOAD_DIR = Path(payload.__file__).resolve().parent
KEEP_RELEASES = defaults.KEEP_RELEASES
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


def has_release(facts: Facts, release: Release) -> bool:
    return any(r.name == release.sha12 and r.size == release.size for r in facts.releases)


def current_is(facts: Facts, release: Release) -> bool:
    link = RemoteLayout.current_target(release.sha12)
    return bool(facts.current) and str(facts.current).rstrip("/").endswith(link)


# --- the steps of push-script ------------------------------------------------------------


def steps(target: Target, release: Release) -> list[Step]:
    """upload → switch current → prune, each skipped when already so."""
    lay = target.layout
    folder = lay.release(release.sha12)
    return [
        Step("upload-release", f"upload payload.pyz ({release.size / 1024:.0f} KiB, sha256 {release.sha12})",
             f"sftp put {folder}/{temp_prefix('payload.pyz')}* then rename to {folder}/payload.pyz",
             "unless that release is already there", run=_upload),
        Step("switch-current", f"point {lay.current} at {lay.current_target(release.sha12)}",
             f"sftp symlink {lay.root}/{temp_prefix('current')}* then rename over {lay.current} (atomic)",
             "unless current already points there", run=_switch),
        Step("prune-releases", f"prune old releases, keeping the last {KEEP_RELEASES}",
             f"rm -rf {lay.releases}/<old>", f"when more than {KEEP_RELEASES} exist", run=_prune),
    ]


def folders(layout: RemoteLayout, release: Release) -> list[str]:
    """The folders an upload of `release` may create (the probe reports which exist)."""
    return parents(layout.release(release.sha12))


@dataclass
class ReleaseCarrier:
    """What the release steps read of their plan's private values (handoff.ops.deploy)."""

    release: Release | None = None


def _release(ctx: HostContext) -> Release:
    rel = ctx.private_as(ReleaseCarrier).release
    if not isinstance(rel, Release):
        raise RuntimeError("the plan carries no release")
    return rel


def _upload(ctx: HostContext, step: Step) -> str:
    return upload(ctx, _release(ctx))


def _switch(ctx: HostContext, step: Step) -> str:
    return switch(ctx, _release(ctx))


def _prune(ctx: HostContext, step: Step) -> str:
    return prune(ctx, _release(ctx))


def upload(ctx: HostContext, release: Release) -> str:
    facts, s = ctx.need_facts(), ctx.session
    if has_release(facts, release):
        return Skipped(f"release {release.sha12} already on the host")
    folder = s.layout.release(release.sha12)
    try:
        created = mkdirs(s.files, folder, known=facts.dirs)
        upload_atomic(s.files, release.data, f"{folder}/payload.pyz", label=s.label)
        if not created:  # a folder made just now holds no earlier run's temp files
            remove_leftovers(s.files, folder, temp_prefix("payload.pyz"))
    except OSError as exc:
        raise RemoteError(f"{s.label}: uploading release {release.sha12} to {folder} failed: {exc}") from None
    return f"uploaded release {release.sha12} ({release.size / 1024:.0f} KiB)"


def switch(ctx: HostContext, release: Release) -> str:
    facts, s = ctx.need_facts(), ctx.session
    if current_is(facts, release):
        return Skipped(f"current already → {release.sha12}")
    lay = s.layout
    tmp = temp_name(lay.current)
    try:
        # rename(2) over the old link swaps it in one step (`mv -T`).
        s.files.symlink(lay.current_target(release.sha12), tmp)
        s.files.rename(tmp, lay.current)
        remove_leftovers(s.files, lay.root, temp_prefix("current"))
    except OSError as exc:
        try:
            s.files.remove(tmp)
        except Exception:
            pass
        raise RemoteError(f"{s.label}: switching {lay.current} failed: {exc}") from None
    return f"current → {lay.current_target(release.sha12)}"


def prune(ctx: HostContext, release: Release, keep: int = KEEP_RELEASES) -> str:
    facts, s = ctx.need_facts(), ctx.session
    names = [r.name for r in facts.releases if r.name != release.sha12]
    keep_old = keep - 1  # the new release is one of the `keep`; releases are oldest first
    doomed = names[: max(0, len(names) - keep_old)]
    if not doomed:
        return Skipped("nothing to prune")
    paths = " ".join(shlex.quote(s.layout.release(n)) for n in doomed)
    s.check(f"rm -rf -- {paths}", "pruning old releases")
    return f"pruned {len(doomed)} old release(s)"
