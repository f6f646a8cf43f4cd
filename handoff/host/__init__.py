"""Layer 3, one host: what to act on and the seam every operation acts through.

- `targets`: `Target`s resolved from `--host`/`--role`, the inventory and ssh_config.
- `session`: the `Session` protocol (commands, remote code, files); no paramiko.
- `ssh_session`: `SSHSession`, the real one over handoff.ssh.connect.
- `facts`: what the probe reports about a host (`Facts`).
- `transfer`: moving bytes: atomic uploads, resumable downloads.
- `progress`: the transfer progress display.
- `keyrecord`: the record beside a minted key on the host (which child key it is).
- `remote_code`: the stdlib-only modules that run ON the hosts (imports nothing of handoff).
- `untrusted`: what a host answers, checked (types, names, sizes) before it is used.

This package's `__init__` imports nothing: `handoff.testing.local` uses the protocol
without pulling in paramiko.
"""

__all__ = ["facts", "keyrecord", "progress", "remote_code", "session", "ssh_session",
           "targets", "transfer", "untrusted"]
