"""Layer 4, running on many hosts: plans as data and the one executor that runs them.

- `parallel`: one thread per host, results in the input order, Ctrl-C closes everything
  (`run_parallel`, `HostReport`); the one way handoff starts per-host threads.
- `plan`: `Plan` / `HostPlan` / `Step`, printed for `--dry-run` or executed.
"""

__all__ = ["parallel", "plan"]
