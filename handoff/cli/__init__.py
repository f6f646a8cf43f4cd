"""Layer 6, the top: what `fab` runs.

- `commands/`: one function per task of fabfile.py (resolve, plan, run, report, exit code),
  a module per command group.
- `program`: handoff's Fabric `Executor` (fabric.yaml), so `-H` acts like `--host`.
- `demo`: `fab demo`, the commands against the test sandbox.
"""

__all__ = ["commands", "demo", "program"]
