"""meta.json: what an output dir holds, and the guard that keeps it one kind of features.

Every setting that shapes the stored tokens or tensors is written once and compared on
every resumed run: a run with other settings is refused (exit 2) rather than adding
features of another kind to the same dir. The rendering (the completion form the
supervised tokens were built with) is one of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from payload.errors import UsageError
from payload.extract.backends import ModelInfo
from payload.extract.config import ExtractConfig
from payload.extract.formats import POSTNORM, Format
from payload.extract.writer import write_json_atomic

# meta.json keys that must match for a resumed run to add to an output dir
SETTINGS = ("num_layers", "hidden_size", "layers", "dtype", "max_length", "overlong",
            "reasoning", "format", "final_state", "turns", "completion_format",
            "feature_dtype", "compress")
# what a meta.json written before a setting existed meant by leaving it out
LEGACY_SETTINGS = {"format": "native", "final_state": "postnorm", "turns": "last",
                   "compress": None}


def _recorded(old: dict[str, Any], key: str) -> Any:
    """A setting as an existing meta.json states it (or meant it, before it was recorded:
    the features were stored in the model's dtype before --feature-dtype existed)."""
    if key == "feature_dtype" and key not in old:
        return old.get("dtype")
    return old.get(key, LEGACY_SETTINGS.get(key))
# settings a meta.json from before them cannot be checked against (not recorded then)
UNRECORDED = {"completion_format"}


def build_meta(cfg: ExtractConfig, info: ModelInfo, fmt: Format,
               rendering: dict[str, Any]) -> dict[str, Any]:
    return {"model": str(cfg.model.resolve()), "num_layers": info.num_layers,
            "hidden_size": info.hidden, "layers": list(info.layers), "dtype": cfg.dtype,
            "feature_dtype": cfg.feature_dtype, "compress": cfg.compress,
            "format": cfg.format, "final_state": cfg.final_state,
            "final_normed": cfg.final_state == POSTNORM,
            "max_length": cfg.max_length, "overlong": cfg.overlong,
            "reasoning": cfg.reasoning, "turns": cfg.turns,
            "completion_format": rendering.get("completion_format"), "rendering": rendering,
            "vocab_size": info.vocab_size,
            **fmt.meta(info.layers, info.vocab_size), "keys": fmt.keys()}


def check_meta(out_dir: Path, meta: dict[str, Any], write: bool = True) -> None:
    """One output dir holds one kind of features: refuse to mix settings on resume."""
    path = out_dir / "meta.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: unreadable ({exc}); move it away to start over") from None
        keys = [k for k in SETTINGS if k in old or k not in UNRECORDED]
        diff = {k: (_recorded(old, k), meta[k]) for k in keys if _recorded(old, k) != meta[k]}
        if diff:
            desc = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise UsageError(f"{out_dir} holds features made with other settings ({desc}); "
                             "use another --output-dir or the same flags")
        if old == meta:
            return
    if write:
        write_json_atomic(path, meta)
