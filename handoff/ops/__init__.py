"""Layer 5, the operations: plans and per-host work, grouped by what they act on.

- `verify`: what each host has against what its role needs, with fixes.
- `releases`: the payload release: built, uploaded, `current` switched.
- `secrets/`: the key's life cycle, from the keyring to the host and back out.
- `keyapi`: OpenRouter's key-management API (child keys), from the workstation.
- `trust`: pinning host keys (`trust-host`).
- `deploy`: the plan composed of verify, push-script and push-key.
- `jobs/`: launch, status, logs, stop, smoke, estimates.
- `merge`, `fetch`: jobs' outputs brought home and merged into one dataset.
- `report/`: the run's HTML report from the fetched files, and its live page.
"""

__all__ = ["deploy", "fetch", "jobs", "keyapi", "merge", "releases", "report", "secrets",
           "trust", "verify"]
