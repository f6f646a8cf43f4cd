"""Child keys: OpenRouter's key-management API, called from the workstation.

A management key (never placed on a host) lets the workstation create API keys with a
spending `limit` and an `expires_at`, read their usage, change their limit and delete them
(`POST /keys`, `GET|PATCH|DELETE /keys/{hash}`, `GET /keys`). handoff mints one such child
key per host, so what sits on a shared container can spend at most its limit, dies on its
own, and is revoked by `cleanup-secrets`.

The surface is small on purpose:
- `Client(base_url, management_key, entry)`: `create`, `get` (None when gone), `patch`,
  `delete` (False when already gone), `find(name)`; each call is one HTTPS request from the
  workstation, with a timeout. Failures raise the `KeyAPIError` tree (handoff.errors), whose
  messages say what to do: 401 a refused management key, 403 not a management key, 429 rate
  limited, no answer at all, anything else. No message carries a key: they name the keyring
  entry, and the server's own words pass redaction.
- `ChildKey`: what the API says about a key (hash, name, limit, usage, expiry), never the
  key itself; `Minted` pairs a fresh key with it, once, for placement.
- the record of which child key a host holds, a small JSON file beside the key
  (`<key_path>.minted.json`), is handoff.host.keyrecord.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from handoff.errors import (
    KeyAPIError,
    KeyAPIFailed,
    KeyAPIRateLimited,
    KeyAPIUnreachable,
    ManagementKeyRefused,
    NotAManagementKey,
)
from payload.redact import REDACTOR

TIMEOUT_S = 20.0

# The list endpoint is paged; a runaway account (or a server that ignores `offset`) must not
# keep `find` looping.
MAX_PAGES = 50


def utc_iso(moment: datetime) -> str:
    """ISO 8601 in UTC with an explicit `Z`, to the second: OpenRouter rejects other zones."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """An API timestamp (`...Z` or with an offset) as an aware datetime; None if absent/bad."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def expiry(ttl_hours: float, now: datetime | None = None) -> str:
    """`expires_at` for a key minted now that lives `ttl_hours`."""
    return utc_iso((now or datetime.now(timezone.utc)) + timedelta(hours=float(ttl_hours)))


def money(value: float | None) -> str:
    return "none" if value is None else f"${value:.4f}"


def until(moment: datetime | None, now: datetime | None = None) -> str:
    """`in 23h 59m` / `EXPIRED 5m ago` / `never`: how long a key has left, for people."""
    if moment is None:
        return "never"
    left = (moment - (now or datetime.now(timezone.utc))).total_seconds()
    span = abs(left)
    text = f"{int(span // 3600)}h {int(span % 3600 // 60)}m" if span >= 3600 else f"{int(span // 60)}m"
    return f"in {text}" if left > 0 else f"EXPIRED {text} ago"


@dataclass(frozen=True)
class ChildKey:
    """What the management API says about one key (never the key)."""

    hash: str
    name: str
    limit: float | None
    limit_remaining: float | None
    usage: float
    expires_at: datetime | None
    disabled: bool

    @classmethod
    def from_json(cls, raw: Any) -> ChildKey:
        if not isinstance(raw, dict) or not isinstance(raw.get("hash"), str):
            raise ValueError("no key object with a hash")

        def number(value: Any) -> float | None:
            return float(value) if isinstance(value, (int, float)) else None

        return cls(raw["hash"], str(raw.get("name") or ""), number(raw.get("limit")),
                   number(raw.get("limit_remaining")), number(raw.get("usage")) or 0.0,
                   parse_time(raw.get("expires_at")), bool(raw.get("disabled")))

    def live(self, now: datetime | None = None, margin_s: float = 0.0) -> bool:
        """Usable for at least `margin_s` more seconds: not disabled, not (nearly) expired."""
        if self.disabled:
            return False
        if self.expires_at is None:
            return True
        now = now or datetime.now(timezone.utc)
        return self.expires_at > now + timedelta(seconds=margin_s)

    def describe(self, now: datetime | None = None) -> str:
        """`used $0.0012 of $5.0000, expires in 23h 59m` (what status and deploy print)."""
        state = " (disabled)" if self.disabled else ""
        return (f"used {money(self.usage)} of {money(self.limit)}, expires "
                f"{until(self.expires_at, now)}{state}")


@dataclass(frozen=True)
class Minted:
    """A key just created: the secret (for placement, once) and its public facts."""

    key: str = field(repr=False)
    info: ChildKey


NAME_PREFIX = "handoff:"


def _segment(text: str) -> str:
    """One part of a child key's name: `:` and `%` escaped (a host label may be
    `user@10.0.0.5:22`), so the parts split back exactly."""
    return text.replace("%", "%25").replace(":", "%3A")


def _unsegment(text: str) -> str:
    return text.replace("%3A", ":").replace("%25", "%")


def child_name(workstation: str, host: str, job: str | None = None) -> str:
    """The name a child key gets at the management API: `handoff:<workstation>:<host>` for
    the host's key (deploy, push-key), `handoff:<workstation>:<host>:<job>` for a job's.
    The API's own key list is then the truth of which keys handoff minted for a host: a
    cleanup with an empty state dir finds them there (`ChildName.parse`), whatever the
    workstation that minted them."""
    parts = [workstation, host] + ([job] if job else [])
    return NAME_PREFIX + ":".join(_segment(p) for p in parts)


@dataclass(frozen=True)
class ChildName:
    """A child key's name read back: which workstation minted it, for which host and job."""

    workstation: str
    host: str
    job: str | None = None
    endpoint: str | None = None  # the older form's `user@address:port` (None: the new form)

    @classmethod
    def parse(cls, name: str) -> ChildName | None:
        """`handoff:<ws>:<host>[:<job>]` read back; also the older form
        `handoff <host> <role/job> <user@address:port> <stamp> #<tag>` (workstation "",
        job unknown: None). None: not a name handoff gives."""
        if name.startswith(NAME_PREFIX):
            parts = name[len(NAME_PREFIX):].split(":")
            if len(parts) in (2, 3) and all(parts):
                return cls(*(_unsegment(p) for p in parts))
            return None
        older = name.split(" ")
        if len(older) >= 6 and older[0] == "handoff" and older[-1].startswith("#"):
            return cls("", older[1], None, older[3])
        return None


class Client:
    """The management API at `base_url` (the inventory's management API:
    handoff.config.inventory.management_api), with `management_key`.

    `entry` names the keyring entry the key came from (`openrouter/management-key`): the
    messages point at it, never at the key.
    """

    def __init__(self, base_url: str, management_key: str, entry: str,
                 timeout: float = TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = management_key
        REDACTOR.add(management_key)
        self.entry = entry
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, entry={self.entry!r})"

    def at(self, base_url: str) -> Client:
        """The same management key at another API (a key minted when base_url was other)."""
        if not base_url or base_url.rstrip("/") == self.base_url:
            return self
        return Client(base_url, self._key, self.entry, self.timeout)

    # -- the calls ---------------------------------------------------------------------------
    def create(self, name: str, limit: float | None, expires_at: str | None) -> Minted:
        """POST /keys. The new key is registered for redaction before anything else."""
        status, body = self._call("POST", "/keys", "create a child key",
                                  {"name": name, "limit": limit, "expires_at": expires_at})
        key = body.get("key") if isinstance(body, dict) else None
        if status not in (200, 201) or not isinstance(key, str) or not key:
            raise KeyAPIFailed(f"the management API at {self.base_url} answered {status} to "
                               f"POST /keys without a key; nothing was placed", status=status)
        REDACTOR.add(key)
        return Minted(key, self._child(body, "POST /keys"))

    def get(self, key_hash: str) -> ChildKey | None:
        """GET /keys/{hash}; None when the API says 404 (deleted, or never existed)."""
        status, body = self._call("GET", f"/keys/{_quote(key_hash)}", "read a child key",
                                  missing_ok=True)
        return None if status == 404 else self._child(body, "GET /keys/{hash}")

    def patch(self, key_hash: str, **changes: Any) -> ChildKey:
        """PATCH /keys/{hash} (e.g. `limit=2.5`)."""
        status, body = self._call("PATCH", f"/keys/{_quote(key_hash)}", "change a child key",
                                  changes, missing_ok=True)
        if status == 404:
            raise KeyAPIFailed(f"child key {key_hash[:12]} no longer exists at {self.base_url} "
                               f"(revoked or expired); mint a new one with `fab push-key`",
                               status=404)
        return self._child(body, "PATCH /keys/{hash}")

    def delete(self, key_hash: str) -> bool:
        """DELETE /keys/{hash}: True when deleted now, False when it was already gone."""
        status, _ = self._call("DELETE", f"/keys/{_quote(key_hash)}", "revoke a child key",
                               missing_ok=True)
        return status != 404

    def revoke(self, key_hash: str) -> bool:
        """Delete, then prove it: GET must answer 404. True when this call deleted it."""
        deleted = self.delete(key_hash)
        still = self.get(key_hash)
        if still is not None:
            raise KeyAPIFailed(f"child key {key_hash[:12]} still answers at {self.base_url} "
                               f"after DELETE; rerun `fab cleanup-secrets`, or delete it in "
                               f"OpenRouter's key settings")
        return deleted

    def find(self, name: str) -> list[ChildKey]:
        """Every key called exactly `name` (GET /keys, all pages, disabled ones included)."""
        return self.listed(lambda key_name: key_name == name)

    def listed(self, wanted: Callable[[str], bool]) -> list[ChildKey]:
        """Every key whose name `wanted` accepts (GET /keys, all pages, disabled ones
        included)."""
        found: list[ChildKey] = []
        offset = 0
        for _ in range(MAX_PAGES):
            query = urllib.parse.urlencode({"include_disabled": "true", "offset": offset})
            _, body = self._call("GET", f"/keys?{query}", "list child keys")
            page = body.get("data") if isinstance(body, dict) else None
            if not isinstance(page, list):
                raise KeyAPIFailed(f"the management API at {self.base_url} answered GET /keys "
                                   f"without a list")
            found += [ChildKey.from_json(k) for k in page
                      if isinstance(k, dict) and isinstance(k.get("name"), str)
                      and isinstance(k.get("hash"), str) and k["hash"] and wanted(k["name"])]
            if not page:
                break
            offset += len(page)
        return found

    # -- one request ---------------------------------------------------------------------------
    def _child(self, body: Any, what: str) -> ChildKey:
        try:
            return ChildKey.from_json(body.get("data") if isinstance(body, dict) else None)
        except ValueError:
            raise KeyAPIFailed(f"the management API at {self.base_url} answered {what} "
                               f"without the key's data") from None

    def _call(self, method: str, path: str, what: str, payload: dict[str, Any] | None = None,
              *, missing_ok: bool = False) -> tuple[int, Any]:
        """(status, parsed JSON body); raises the KeyAPIError for anything but 2xx (and 404
        when `missing_ok`)."""
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self._key}", "Accept": "application/json",
            "Content-Type": "application/json", "User-Agent": "handoff",
        })
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            status, body = exc.code, _json(exc.read())
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            exc.close()
            if status == 404 and missing_ok:
                return status, body
            raise self._error(status, body, what, retry_after) from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise KeyAPIUnreachable(
                f"cannot reach the management API at {self.base_url} to {what} "
                f"({_redacted(reason)}); check `management_api` (else `base_url`) in the "
                f"inventory's defaults and the network, then rerun"
            ) from None

    def _error(self, status: int, body: Any, what: str, retry_after: str | None) -> KeyAPIError:
        said = _message(body)
        where = f"the management API at {self.base_url}"
        if status == 401:
            return ManagementKeyRefused(
                f"{where} refused the management key stored as {self.entry} while trying to "
                f"{what} (401: {said}). If {self.base_url} is not the management API of the "
                f"account that key belongs to, name the right one as `management_api` in the "
                f"inventory's defaults (the management key goes only there); if it is, store "
                f"a valid key with `fab set-key --username {self.entry.rsplit('/', 1)[-1]}`. "
                f"Then rerun.", status=status)
        if status == 403:
            return NotAManagementKey(
                f"{where} would not let the key stored as {self.entry} {what} (403: {said}): "
                f"it is not a management key. Create one in OpenRouter's settings (Management "
                f"API keys) and store it with `fab set-key --username "
                f"{self.entry.rsplit('/', 1)[-1]}`, or set key_mode: plain.", status=status)
        if status == 429:
            wait = f", asks to wait {retry_after} s" if retry_after else ""
            return KeyAPIRateLimited(f"{where} is rate-limiting ({status}{wait}) while trying to "
                                     f"{what}; wait a minute and rerun.", status=status)
        if status >= 500:
            return KeyAPIFailed(f"{where} failed to {what} ({status}: {said}); rerun later.",
                                status=status)
        return KeyAPIFailed(f"{where} refused to {what} ({status}: {said}).", status=status)


def _quote(key_hash: str) -> str:
    return urllib.parse.quote(key_hash, safe="")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8")) if raw else None
    except (UnicodeDecodeError, ValueError):
        return None


def _redacted(value: Any) -> str:
    return REDACTOR.redact(str(value))


def _message(body: Any) -> str:
    """The server's own words (`error.message`), redacted and kept short."""
    error = body.get("error") if isinstance(body, dict) else None
    text = error.get("message") if isinstance(error, dict) else None
    return _redacted(text if isinstance(text, str) and text else "no message")[:300]


__all__ = ["NAME_PREFIX", "ChildKey", "ChildName", "Client", "Minted", "child_name", "expiry", "money",
           "parse_time", "until", "utc_iso"]
