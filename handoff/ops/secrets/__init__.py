"""The key, from the keyring to the host and back out: read, minted, placed, removed, revoked.

This package is the one home of the secret's life cycle, one module per step:
- read from the OS keyring (handoff.config.os_keyring: `read_key`, `read_optional`),
  registered for redaction at once. Two entries matter: the API key (`openrouter/api-key`)
  and, optionally, a management key (`openrouter/management-key`) that never leaves the
  workstation;
- `settings`: chosen per host by `key_mode` (`key_settings`): `plain` places the API key
  itself, `minted` a child key minted for that host through the management API
  (handoff.ops.keyapi) with `limit` = `key_limit` and `expires_at` = now + `key_ttl_hours`,
  `auto` (the default) minted when a management key is stored, else plain; the keyring
  entries the hosts' modes need (`read_credentials[_soon]`);
- `step`, `place`, `minted`: placed on a host by deploy/push-key (`place_step`, `place`,
  `place_minted`), over SFTP, never through a command line or `env=`:
  1. the key's folder is created / forced to 0700;
  2. a temp name in that folder is created exclusively with mode 0600 given IN the create
     request itself, so the file is 0600 from the instant it exists;
  3. the key is written and fsync'ed;
  4. the temp name is renamed over the final path (POSIX rename);
  5. `stat` checks mode 0600 and owner = the login user; anything else is removed and
     reported.
  Idempotence is checked on the host: the probe returns the sha256 of the remote file,
  compared with the local key's sha256; the key itself never travels for that. A minted
  key is reused while it lives (the record beside it, handoff.host.keyrecord, names its
  hash; the API says whether it is live), replaced when it expired, was revoked or expires
  within the hour, and the key it replaces is revoked. A minted key whose placement failed
  is revoked again; a create whose answer was lost is found by its unique name and deleted.
- `cleanup`: removed by cleanup-secrets (`cleanup_entries`, `cleanup_plan`, `remove`):
  every key the ledger lists as placed, and the `key_path` of every inventory and
  remembered host (or of the hosts named with --host), temp leftovers included, then
  proven gone by a stat;
- `revoke`: revoked by cleanup-secrets (`revocations`, `revoke_all`): every child key the
  ledger lists as minted and every one a host's record names, `DELETE /keys/{hash}` then
  `GET` answering 404. An unreachable host's key is revoked all the same: its file may
  remain, dead.
- `workflow`: cleanup-secrets from start to end, `cleanup` then `revoke` and the summary.

The ledger (handoff.config.state) records host, path, time, the first 8 hex of
sha256(key) and, for a child key, its public hash and the API that minted it; never a key.
This package's `__init__` imports nothing.
"""

__all__ = ["cleanup", "minted", "place", "revoke", "settings", "step", "workflow"]
