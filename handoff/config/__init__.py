"""Layer 1, the workstation's configuration: where things are and what the user asked for.

Nothing here opens a connection. Imports only the foundations (handoff.errors, .defaults,
.console) and each other.

- `paths`: the project directory and the files looked up in it (inventory, roles, state).
- `yamlfile`: YAML read with line numbers kept for messages.
- `flags`: the one home of numeric checks of a flag or an inventory var.
- `inventory`: `inventory/hosts.yml`, checked (hosts, groups, vars).
- `roles`: what a host is for (`roles/*.yml`, the shipped defaults).
- `layout`: where things live on a host (`RemoteLayout`), and remote path helpers.
- `state`: the local state dir: the last deploy's hosts, the key ledger, this
  workstation's id, what the last smoke test measured (checked when saved and read).
- `shards`: each job's shard layout as this workstation launched it (the hosts, in
  order, and each one's shard): what status, jobs and fetch judge by.
- `os_keyring`: the OS keyring (the API and management keys), and key fingerprints.

This package's `__init__` imports nothing, so importing one module costs only that module.
"""

__all__ = ["flags", "inventory", "layout", "os_keyring", "paths", "roles", "shards", "state",
           "yamlfile"]
