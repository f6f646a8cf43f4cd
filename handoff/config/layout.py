"""The folders handoff keeps on a host, named in one place.

```
<remote_dir>/                 the `remote_dir` var, default ~/.handoff
  releases/<sha12>/payload.pyz   one folder per payload release (push-script)
  current -> releases/<sha12>    the release jobs run
  secrets/openrouter.key         the API key (0700 folder, 0600 file; `key_path` moves it)
  secrets/openrouter.key.minted.json  which child key the file holds (hash, API; minted mode)
  secrets/jobs/<job>.key(.minted.json)  a job's own child key (a job with a budget, minted mode)
  data/<file>                    inputs pushed by `fab launch --input`
  jobs/<job>/                    one folder per job: output, status, log, pid, job.json
  venv/                          made by `fab verify --install`, used from then on
```

Paths are kept as configured (`~/.handoff/...`) until the host's home is known (the probe
reports it); `expand_home` is the one place that turns `~` into that home. Shell commands
keep `~` live with `session.sh_path`, SFTP and remote code get absolute paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff import defaults


def expand_home(path: str, home: str) -> str:
    """`~` and `~/x` under `home` (the remote user's home); any other path unchanged."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + "/" + path[2:]
    return path


def sftp_path(path: str) -> str:
    """A path as SFTP takes it before the home is known: SFTP starts in the login user's
    home, so `~/x` is the relative `x`."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


def parents(path: str) -> list[str]:
    """`path` and each folder above it (`~/a/b` -> `~/a/b`, `~/a`, `~`): what a deploy asks
    the probe about, so creating folders later needs no stat round trips."""
    out = []
    while path not in ("", "/", "~"):
        out.append(path)
        path = path.rsplit("/", 1)[0] if "/" in path else ""
    return out + (["~"] if path == "~" else [])


def job_key_path(key_path: str, job: str) -> str:
    """Where a job with a budget finds its own child key on the host: `<key folder>/jobs/
    <job>.key` beside the host's key (0700 folder, 0600 file), never in the job's folder,
    which fetch brings back."""
    return f"{key_path.rsplit('/', 1)[0]}/jobs/{job}.key"


def job_keys_folder(key_path: str) -> str:
    """The folder of the jobs' own keys (`job_key_path`)."""
    return f"{key_path.rsplit('/', 1)[0]}/jobs"


def key_record(key_path: str) -> str:
    """The record beside a minted key (`<key_path>.minted.json`): the child key's public
    hash and the API it belongs to, so the host itself says what to revoke."""
    return f"{key_path}.minted.json"


@dataclass(frozen=True)
class RemoteLayout:
    """Every path handoff uses under one host's remote_dir (`root`)."""

    root: str  # remote_dir, without a trailing slash; may start with `~`

    @classmethod
    def of(cls, variables: dict[str, Any]) -> RemoteLayout:
        """The layout a host's merged vars describe."""
        return cls(str(variables.get("remote_dir") or defaults.REMOTE_DIR).rstrip("/") or "/")

    def under(self, home: str) -> RemoteLayout:
        """The same layout with `~` resolved against the host's home."""
        return RemoteLayout(expand_home(self.root, home))

    @property
    def releases(self) -> str:
        return f"{self.root}/releases"

    def release(self, name: str) -> str:
        return f"{self.releases}/{name}"

    @staticmethod
    def current_target(name: str) -> str:
        """What `current` points at for release `name`: relative, so the link stays right
        whatever the absolute path of remote_dir."""
        return f"releases/{name}"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def payload(self) -> str:
        """The payload jobs run: always through `current`."""
        return f"{self.current}/payload.pyz"

    @property
    def secrets(self) -> str:
        return f"{self.root}/secrets"

    @property
    def key_path(self) -> str:
        """The default `key_path`."""
        return f"{self.root}/{defaults.KEY_FILE}"

    @property
    def data(self) -> str:
        return f"{self.root}/data"

    def data_file(self, name: str) -> str:
        return f"{self.data}/{name}"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    def job(self, name: str) -> str:
        return f"{self.jobs}/{name}"

    @property
    def venv(self) -> str:
        return f"{self.root}/venv"

    @property
    def venv_python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def venv_marker(self) -> str:
        """Left in the venv by `verify --install`: only a venv with it is used (a folder
        someone else put at `venv/` is not handoff's)."""
        return f"{self.venv}/{defaults.VENV_MARKER}"
