"""The control plane's defaults, defined once: keyring names, the remote layout's names,
and the standard inventory vars with their default values.

What the payload shares (base URL, model, provider, concurrency) comes from
`payload.defaults`, so a default means the same on the workstation and on the host.
"""

from __future__ import annotations

from typing import Any

from payload import defaults as payload_defaults

# The OS keyring entry the API key is read from (`keyring.get_password(service, username)`).
SECRET_SERVICE = "openrouter"
API_KEY_USERNAME = "api-key"
# The keyring username of an OpenRouter management key (same service). With one stored,
# handoff mints a spend-capped, expiring child key per host instead of placing the API key.
MANAGEMENT_KEY_USERNAME = "management-key"

# How a host gets its key (the `key_mode` var): `plain` places the keyring's API key,
# `minted` a child key minted for that host, `auto` minted when a management key is stored.
KEY_MODES = ("plain", "minted", "auto")
# A child key is replaced rather than reused when it expires within this many seconds: a
# redeploy must not hand a job a key that dies an hour into the run.
KEY_RENEW_BEFORE_S = 3600.0

# Where handoff keeps everything it places on a host, unless the `remote_dir` var moves it.
REMOTE_DIR = "~/.handoff"
# The key's file under remote_dir, unless the `key_path` var places it elsewhere.
KEY_FILE = "secrets/openrouter.key"
# Release folders kept on a host after a push (the new one included).
KEEP_RELEASES = 3
# The role a target gets when neither `--role`, the inventory nor the last deploy names one.
DEFAULT_ROLE = "generator"

# Seconds one SSH request (an SFTP operation, opening a channel) may wait for a host before
# that host fails (a stalled SFTP server must not hold the whole command).
IO_TIMEOUT_S = 60.0

# The standard vars, with their defaults (lowest precedence: the inventory's `defaults`,
# role vars, group vars, host vars and task flags all override them). `key_path` follows
# `remote_dir` unless set: moving remote_dir moves everything handoff places.
# The file `verify --install` leaves in the venv it made (remote_code/install.py names it too).
VENV_MARKER = ".handoff-venv"

BUILTIN_VARS: dict[str, Any] = {
    "python": "python3",
    "remote_dir": REMOTE_DIR,
    "key_path": None,  # -> {remote_dir}/secrets/openrouter.key (layout.RemoteLayout.key_path)
    "secret_service": SECRET_SERVICE,
    "secret_username": API_KEY_USERNAME,
    "base_url": payload_defaults.BASE_URL,
    "model": payload_defaults.MODEL,
    # Unset: `--provider` is not passed and the payload's own rule applies (its default
    # routing object goes to OpenRouter only; other servers get none). A value set in the
    # inventory or a flag is passed as given.
    "provider": None,
    "concurrency": payload_defaults.CONCURRENCY,
    "max_cost": None,
    "gpus": None,
    "io_timeout": IO_TIMEOUT_S,
    "key_mode": "auto",
    "key_limit": None,  # USD; required with key_mode minted
    "key_ttl_hours": 24,
    # Seconds a fresh job is watched for an instant crash (a bad flag, a missing file); the
    # same as handoff.host.remote_code.jobs.START_WATCH_S, which the host uses when none is
    # given. Tests that do not depend on it set it short.
    "start_watch_s": 1.0,
}
