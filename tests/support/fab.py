"""Where the tests find `fab`: beside the interpreter running them (the venv's bin), so any
checkout's or CI's venv works, not only `<repo>/.venv`."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAB = Path(sys.executable).parent / "fab"
