"""What every output format is: the `Format` interface, and the file-per-sample base.

The pipeline (read, own, resume, preflight, forward, write) is the same for every
format; a `Format` decides only what a sample's file is called and holds, how a file
found on resume is checked, what the disk preflight counts and what is left to do
when a rank ends. No converter runs afterwards: for Kimi-K2.5 (H=7168) a second copy
of the features would be terabytes on a disk that is already the limit.

This module sits below the formats (native.py, specforge.py, speculators.py), which
import it and never each other. Importing it is torch-free (config.py reads the tables
here; the preflight plans with a format's sizes); torch is imported where a sample is
written or a `.ckpt` checked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from payload.extract.writer import (
    ManifestPart,
    clean_temp_files,
    id_relpath,
    merge_manifest,
    read_manifest_keys,
)

if TYPE_CHECKING:
    from payload.extract.tokens import Conversation, Sample

PRENORM, POSTNORM = "prenorm", "postnorm"
FINAL_STATES = (PRENORM, POSTNORM)
FORMATS = ("native", "specforge", "speculators")
# The final state each trainer computes its teacher logits from; `--final-state`'s default.
NEEDS_FINAL_STATE = {"native": POSTNORM, "specforge": POSTNORM, "speculators": PRENORM}
SAMPLES_DIR = "samples"


class Format(ABC):
    """One output layout. One instance per run, used by the pipeline's stages in order:
    `open` → `done` per owned id → `clean_temp_files` → `write`/`record` per sample → `close`.
    """

    name: str
    # What aux index N (the last layer) holds: HF's post-norm tuple entry (native) or the
    # last decoder layer's raw output, as the trainers' own capture stores it.
    raw_last_layer: bool = True

    def __init__(self, out: Path, hidden: int, dtype: str, compress: str | None = None) -> None:
        self.out = out
        self.hidden = hidden
        self.dtype = dtype  # what the files hold (--feature-dtype)
        self.compress = compress  # --compress (specforge's gzip); config refuses it elsewhere

    # -- planning (the preflight; no torch) --------------------------------------------
    @abstractmethod
    def sample_bytes(self, sample: Sample) -> int:
        """Bytes of the sample's own file (the preflight rounds it up to a block)."""

    def shared_bytes(self, sample: Sample) -> int:
        """Bytes the sample adds to files shared by all samples (a dataset's columns)."""
        return 0

    def fixed_bytes(self, vocab_size: int) -> int:
        """Bytes of the shared files themselves, whatever the samples (headers, maps)."""
        return 0

    @abstractmethod
    def bytes_per_token(self) -> int:
        """The theoretical bytes a token costs on disk (features + ids + mask)."""

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        """Keys this format adds to meta.json (trainer-side settings and conventions)."""
        return {}

    @abstractmethod
    def keys(self) -> dict[str, str]:
        """What each stored tensor is, for meta.json."""

    # -- the run -----------------------------------------------------------------------
    @abstractmethod
    def open(self, tag: str, *, dry: bool) -> None:
        """Before the resume checks; `dry` (--preflight-only) must write nothing."""

    @abstractmethod
    def done(self, conv: Conversation) -> bool:
        """Whether this id's sample is already on disk, complete (resume by id)."""

    @abstractmethod
    def relpath(self, key: str) -> str:
        """Where a new sample for this id is written (relative to the output dir)."""

    def clean_temp_files(self, keys: list[str]) -> int:
        return clean_temp_files(self.out, {self.relpath(k) for k in keys})

    @abstractmethod
    def write(self, sample: Sample, aux: Any, final: Any, scale: Any = None) -> int:
        """Write one sample (aux [T, 3H], final [T, H], CPU, in the feature dtype; `scale`
        [T] float32 with FP8 features, else None); returns its bytes.

        Runs on the writer threads, several at once (distinct samples).
        """

    @abstractmethod
    def record(self, sample: Sample) -> None:
        """After `write`, under the pipeline's lock: list the sample."""

    @abstractmethod
    def close(self) -> str | None:
        """When this rank ends (finished, stopped, failed): settle what lists the
        samples; returns a line for the log, if there is something to say."""


class FilePerSample(Format):
    """native and specforge: one file per id at a path derived from the id; each rank
    lists its samples in its manifest part, merged into manifest.jsonl at the end."""

    suffix = ""

    def __init__(self, out: Path, hidden: int, dtype: str, compress: str | None = None) -> None:
        super().__init__(out, hidden, dtype, compress)
        self._part: ManifestPart | None = None
        self._listed: set[str] = set()

    def relpath(self, key: str) -> str:
        return id_relpath(key, SAMPLES_DIR, self.suffix)

    def open(self, tag: str, *, dry: bool) -> None:
        self._listed = read_manifest_keys(self.out)
        self._part = None if dry else ManifestPart(self.out, tag)

    @abstractmethod
    def check(self, path: Path) -> tuple[int, int] | None:
        """(tokens, supervised tokens) when `path` is a complete file of this run's shape."""

    def done(self, conv: Conversation) -> bool:
        rel = self.relpath(conv.key)
        path = self.out / rel
        found = self.check(path) if path.exists() else None
        if found is None:
            return False
        if self._part is not None and conv.key not in self._listed:
            self._part.add(conv.id, rel, *found)  # renamed, killed before its manifest line
        return True

    def record(self, sample: Sample) -> None:
        assert self._part is not None, "write() in a dry run"
        self._part.add(sample.id, self.relpath(sample.key), sample.num_tokens,
                       sample.num_supervised)

    def close(self) -> str | None:
        if self._part is None:
            return None
        self._part.close()
        merge_manifest(self.out)
        return None
