"""The fake OpenRouter's API keys: the management API and the accounting per key.

`KeyStore` is what `FakeOpenRouter.keys` holds. It serves, in the shapes of OpenRouter's
published OpenAPI description (paths `/keys` and `/keys/{hash}`):

- `GET /keys` (paged by `offset`, `include_disabled`), `POST /keys` (201 `{"data", "key"}`),
  `GET|PATCH /keys/{hash}` (`{"data"}`), `DELETE /keys/{hash}` (`{"deleted": true}`), each
  authenticated by a management key: none or an unknown one is a 401, an ordinary API key
  (the account's own or a child key) a 403. `expires_at` must be UTC (`Z` or +00:00),
  else 400, as OpenRouter says it rejects other zones.
- For chat requests and `GET /key`: which key authenticated each request (the account's
  own, `ROOT`, or a child key by hash) is counted in `served_by`, so a test can prove a job
  ran on its child key only. A child key that is expired, disabled or deleted is a 401; one
  whose usage would pass its `limit` is a 402 with `metadata.limit_source` =
  `openrouter_key_limit` (as the real API marks a key limit, not the account's credit).
  Every success adds its cost to that key's `usage`.
- `inject(MgmtFault(...))` makes management calls fail on a schedule: a status instead of
  the answer, a cut connection (status 0), or the operation done and its answer lost
  (`after_effect`): a create whose key exists but whose caller never learnt its hash.

`enable(management_key)` turns the management API on (off by default: a fake without it
answers 401 there, like an account with no management key). Nothing here is imported by
the control plane.
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

ROOT = "root"  # served_by's name for the account's own API key (not a child key)
KEY_LIMIT_SOURCE = "openrouter_key_limit"
OPS = ("list", "create", "get", "patch", "delete")


def _request_key(name: str) -> Any:
    """aiohttp >= 3.12 wants typed keys for what a request carries; older ones take a str."""
    maker = getattr(web, "RequestKey", None)
    return maker(name, object) if maker is not None else name


_WHO = _request_key("fake_key")  # ROOT, a child key's hash, or None
_WHY = _request_key("fake_refusal")  # the 401's message


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def parse_utc(text: str) -> datetime:
    """An `expires_at` as the API accepts it: ISO 8601 in UTC; ValueError otherwise."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    offset = moment.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValueError("expires_at must be an ISO 8601 UTC timestamp (e.g. ...Z)")
    return moment


@dataclass
class ChildKey:
    """One key minted through the management API, with its accounting."""

    key: str = field(repr=False)
    hash: str
    name: str
    limit: float | None = None
    limit_reset: str | None = None
    include_byok_in_limit: bool = False
    expires_at: datetime | None = None
    disabled: bool = False
    usage: float = 0.0
    created_at: datetime = field(default_factory=_now)
    updated_at: datetime | None = None

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and (now or _now()) >= self.expires_at

    @property
    def limit_remaining(self) -> float | None:
        return None if self.limit is None else round(max(0.0, self.limit - self.usage), 10)

    @property
    def label(self) -> str:
        return f"{self.key[:12]}...{self.key[-3:]}"

    def record(self) -> dict[str, Any]:
        """The key object of `/keys` answers (every field the spec marks required)."""
        usage = round(self.usage, 10)
        return {
            "hash": self.hash, "name": self.name, "label": self.label,
            "disabled": self.disabled, "limit": self.limit,
            "limit_remaining": self.limit_remaining, "limit_reset": self.limit_reset,
            "include_byok_in_limit": self.include_byok_in_limit,
            "usage": usage, "usage_daily": usage, "usage_weekly": usage, "usage_monthly": usage,
            "byok_usage": 0.0, "byok_usage_daily": 0.0, "byok_usage_weekly": 0.0,
            "byok_usage_monthly": 0.0, "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at) if self.updated_at else None,
            "creator_user_id": "user_fake", "workspace_id": "00000000-0000-4000-8000-000000000000",
            "expires_at": _iso(self.expires_at) if self.expires_at else None,
        }

    def current_key(self) -> dict[str, Any]:
        """`GET /key` as this key sees itself."""
        usage = round(self.usage, 10)
        return {
            "label": self.label, "usage": usage, "limit": self.limit,
            "limit_remaining": self.limit_remaining, "limit_reset": self.limit_reset,
            "expires_at": _iso(self.expires_at) if self.expires_at else None,
            "is_free_tier": False, "is_management_key": False, "is_provisioning_key": False,
            "include_byok_in_limit": self.include_byok_in_limit, "byok_usage": 0,
            "byok_usage_daily": 0, "byok_usage_weekly": 0, "byok_usage_monthly": 0,
            "usage_daily": usage, "usage_weekly": usage, "usage_monthly": usage,
            "creator_user_id": "user_fake",
            "rate_limit": {"requests": -1, "interval": "10s",
                           "note": "This field is deprecated and safe to ignore."},
        }


@dataclass
class MgmtFault:
    """Fail management calls of kind `op` (one of OPS, or `*`): let `skip` through first,
    then fail `times` of them (-1: every one) with `status` (0: cut the connection). With
    `after_effect` the operation is done first and only its answer is lost. `subject`, when
    set, limits the fault to calls about a key whose name (create) or hash holds it, so a
    test can aim it at one host whatever order the hosts' calls arrive in."""

    op: str
    status: int = 500
    skip: int = 0
    times: int = 1
    after_effect: bool = False
    subject: str | None = None
    seen: int = 0

    def hits(self, op: str, subject: str | None = None) -> bool:
        if self.op not in (op, "*"):
            return False
        if self.subject is not None and (subject is None or self.subject not in subject):
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        return self.times < 0 or self.seen - self.skip <= self.times


class KeyStore:
    """The keys the fake knows, the management API over them, and who served what."""

    def __init__(self, root_key: Callable[[], str] = str, page_size: int = 100) -> None:
        # The account's own API key (read when needed: tests swap the fake's key): it works
        # for chat and is a 403 at the management API.
        self._root_key = root_key
        self.management_keys: set[str] = set()
        self.keys: dict[str, ChildKey] = {}
        self.deleted: dict[str, ChildKey] = {}  # revoked keys still refuse with a 401
        self.served_by: Counter[str] = Counter()  # chat requests per key (ROOT or a hash)
        self.calls: Counter[str] = Counter()  # management calls per op, faults included
        self.log: list[tuple[str, str, int]] = []  # (op, hash or name, status answered)
        self.faults: list[MgmtFault] = []
        self.page_size = page_size
        self._lock = threading.Lock()

    # -- test controls -----------------------------------------------------------------------
    def enable(self, management_key: str) -> None:
        self.management_keys.add(management_key)

    def inject(self, fault: MgmtFault) -> None:
        if fault.op not in (*OPS, "*"):
            raise ValueError(f"unknown management op {fault.op!r}; known: {', '.join(OPS)}")
        self.faults.append(fault)

    def live(self) -> list[ChildKey]:
        """Keys that still work (not deleted, disabled or expired)."""
        now = _now()
        return [k for k in self.keys.values() if not k.disabled and not k.expired(now)]

    def by_key(self, key: str) -> ChildKey | None:
        return next((k for k in self.keys.values() if k.key == key), None)

    def expire(self, key_hash: str) -> None:
        """Make a key expire now (as if its TTL ran out)."""
        self.keys[key_hash].expires_at = _now()

    # -- the chat side: who is calling, may they spend ------------------------------------------
    def authorize(self, request: web.Request) -> bool:
        """Is the request's bearer a usable key? Remembers which one on the request."""
        token = _bearer(request)
        child = self.by_key(token) if token else None
        if token and token == self._root_key():
            request[_WHO] = ROOT
        elif child is not None and not child.disabled and not child.expired():
            request[_WHO] = child.hash
        else:
            request[_WHO] = None
            revoked = any(k.key == token for k in self.deleted.values()) if token else False
            request[_WHY] = (
                "API key expired" if child is not None and child.expired()
                else "API key disabled" if child is not None
                else "API key revoked (User not found)" if revoked
                else "No auth credentials found")
            return False
        if request.path.endswith("/chat/completions"):
            self.served_by[request[_WHO]] += 1
        return True

    def refusal(self, request: web.Request) -> str:
        return str(request.get(_WHY) or "No auth credentials found")

    def child_of(self, request: web.Request) -> ChildKey | None:
        who = request.get(_WHO)
        return self.keys.get(who) if isinstance(who, str) and who != ROOT else None

    def over_limit(self, request: web.Request, cost: float) -> dict[str, Any] | None:
        """The 402 to answer when this request would take the child key past its limit."""
        child = self.child_of(request)
        if child is None or child.limit is None or child.usage + cost <= child.limit + 1e-12:
            return None
        return {"message": f"Key limit exceeded: this key's limit of ${child.limit:g} is "
                           f"reached (usage ${child.usage:.6f}). Raise it in the key settings.",
                "metadata": {"limit_source": KEY_LIMIT_SOURCE, "limit": child.limit,
                             "usage": round(child.usage, 10)}}

    def charge(self, request: web.Request, cost: float) -> None:
        child = self.child_of(request)
        if child is not None:
            with self._lock:
                child.usage += cost

    # -- the management API --------------------------------------------------------------------
    def add_routes(self, app: web.Application, prefix: str) -> None:
        app.router.add_get(prefix + "/keys", self._list)
        app.router.add_post(prefix + "/keys", self._create)
        app.router.add_get(prefix + "/keys/{hash}", self._get)
        app.router.add_patch(prefix + "/keys/{hash}", self._patch)
        app.router.add_delete(prefix + "/keys/{hash}", self._delete)

    def _gate(self, request: web.Request, op: str,
              subject: str | None = None) -> web.Response | MgmtFault | None:
        """Authentication and scheduled faults, before the operation."""
        self.calls[op] += 1
        token = _bearer(request)
        if not token:
            return _error(401, "Missing Authentication header")
        if token not in self.management_keys:
            if self.by_key(token) is not None or token == self._root_key():
                return _error(403, "Only management keys can perform this operation")
            return _error(401, "Invalid management key")
        fault = next((f for f in self.faults if f.hits(op, subject)), None)
        if fault is None:
            return None
        if fault.after_effect:
            return fault  # the caller does the work, then answers with the fault
        return _fault_answer(request, fault)

    def _answer(self, request: web.Request, gate: MgmtFault | None, op: str, subject: str,
                response: web.Response) -> web.Response:
        if isinstance(gate, MgmtFault):
            response = _fault_answer(request, gate)
        self.log.append((op, subject, response.status))
        return response

    async def _list(self, request: web.Request) -> web.Response:
        gate = self._gate(request, "list")
        if isinstance(gate, web.Response):
            return gate
        try:
            offset = int(request.query.get("offset") or 0)
        except ValueError:
            return _error(400, "offset must be an integer")
        disabled = request.query.get("include_disabled", "false").lower() == "true"
        keys = [k for k in sorted(self.keys.values(), key=lambda k: k.created_at)
                if disabled or not k.disabled]
        page = keys[max(0, offset): max(0, offset) + self.page_size]
        return self._answer(request, gate, "list", str(offset),
                            web.json_response({"data": [k.record() for k in page]}))

    async def _create(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = ValueError  # answered after authentication, as the real API orders them
        name = body.get("name") if isinstance(body, dict) else None
        gate = self._gate(request, "create", name if isinstance(name, str) else None)
        if isinstance(gate, web.Response):
            return gate
        if body is ValueError:
            return _error(400, "Invalid request parameters: body is not JSON")
        if not isinstance(name, str) or not name.strip():
            return _error(400, "Invalid request parameters: name is required")
        problem, fields = _fields(body)
        if problem:
            return _error(400, f"Invalid request parameters: {problem}")
        key = "sk-or-v1-" + secrets.token_hex(32)
        child = ChildKey(key=key, hash=secrets.token_hex(32), name=name, **fields)
        with self._lock:
            self.keys[child.hash] = child
        return self._answer(request, gate, "create", name,
                            web.json_response({"data": child.record(), "key": key}, status=201))

    async def _get(self, request: web.Request) -> web.Response:
        gate = self._gate(request, "get", request.match_info["hash"])
        if isinstance(gate, web.Response):
            return gate
        child = self.keys.get(request.match_info["hash"])
        response = _error(404, "Resource not found") if child is None else \
            web.json_response({"data": child.record()})
        return self._answer(request, gate, "get", request.match_info["hash"], response)

    async def _patch(self, request: web.Request) -> web.Response:
        gate = self._gate(request, "patch", request.match_info["hash"])
        if isinstance(gate, web.Response):
            return gate
        child = self.keys.get(request.match_info["hash"])
        if child is None:
            return self._answer(request, gate, "patch", request.match_info["hash"],
                                _error(404, "Resource not found"))
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Invalid request parameters: body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "Invalid request parameters")
        problem, fields = _fields({k: v for k, v in body.items() if k != "expires_at"})
        if problem:
            return _error(400, f"Invalid request parameters: {problem}")
        with self._lock:
            for name, value in fields.items():
                setattr(child, name, value)
            if isinstance(body.get("name"), str) and body["name"].strip():
                child.name = body["name"]
            if isinstance(body.get("disabled"), bool):
                child.disabled = body["disabled"]
            child.updated_at = _now()
        return self._answer(request, gate, "patch", child.hash,
                            web.json_response({"data": child.record()}))

    async def _delete(self, request: web.Request) -> web.Response:
        gate = self._gate(request, "delete", request.match_info["hash"])
        if isinstance(gate, web.Response):
            return gate
        with self._lock:
            child = self.keys.pop(request.match_info["hash"], None)
            if child is not None:
                self.deleted[child.hash] = child
        response = _error(404, "Resource not found") if child is None else \
            web.json_response({"deleted": True})
        return self._answer(request, gate, "delete", request.match_info["hash"], response)


def _fields(body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The settable fields of a create/patch body, checked as the spec types them."""
    out: dict[str, Any] = {}
    if "limit" in body:
        limit = body["limit"]
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                                  or limit < 0):
            return "limit must be a non-negative number or null", {}
        out["limit"] = None if limit is None else float(limit)
    if "limit_reset" in body:
        if body["limit_reset"] not in (None, "daily", "weekly", "monthly"):
            return "limit_reset must be daily, weekly, monthly or null", {}
        out["limit_reset"] = body["limit_reset"]
    if "include_byok_in_limit" in body:
        out["include_byok_in_limit"] = bool(body["include_byok_in_limit"])
    if body.get("expires_at") is not None:
        try:
            moment = parse_utc(str(body["expires_at"]))
        except ValueError:
            return "expires_at must be an ISO 8601 UTC timestamp; other timezones are rejected", {}
        if moment <= _now():
            return "expires_at must be in the future", {}
        out["expires_at"] = moment
    return None, out


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[len("Bearer "):].strip() if header.startswith("Bearer ") else ""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message}}, status=status)


def _fault_answer(request: web.Request, fault: MgmtFault) -> web.Response:
    if fault.status == 0:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("fake management API: connection cut")
    messages = {401: "Invalid management key", 403: "Only management keys can perform this "
                "operation", 429: "Rate limit exceeded", 500: "Internal Server Error"}
    response = _error(fault.status, messages.get(fault.status, "error"))
    if fault.status == 429:
        response.headers["Retry-After"] = "1"
    return response
