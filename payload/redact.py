"""Masking of secrets in everything that is printed or logged.

One place, used by the payload on the containers and by handoff on the workstation
(handoff may import payload; never the reverse). A secret is registered once, then
every line of output passes `redact()`; the logging filter and the stream wrapper
apply it where code would otherwise print directly.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, TextIO

MASK = "****"
_MIN_LEN = 6  # shorter strings would mask ordinary words; no real API key is that short


class Redactor:
    """Thread-safe set of secrets; `redact` replaces each occurrence with a masked form."""

    def __init__(self) -> None:
        self._secrets: list[str] = []
        self._lock = threading.Lock()

    def add(self, secret: str | None) -> None:
        if not secret:
            return
        secret = secret.strip()
        if len(secret) < _MIN_LEN:
            return
        with self._lock:
            if secret not in self._secrets:
                # Longest first, so a secret that contains another is masked whole.
                self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def clear(self) -> None:
        with self._lock:
            self._secrets = []

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, mask(secret))
        return text

    def redact_any(self, value: Any) -> Any:
        """Redact strings nested in dicts/lists (for JSON records and status files)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_any(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_any(v) for v in value]
        return value


def mask(secret: str) -> str:
    """Keep a short recognisable prefix (e.g. `sk-or-v1-`) so users can tell keys apart."""
    prefix = secret[:9] if secret.startswith("sk-") and len(secret) > 24 else ""
    return prefix + MASK


REDACTOR = Redactor()


def redact(text: str) -> str:
    return REDACTOR.redact(text)


class RedactingFilter(logging.Filter):
    """Logging filter: formats the record once, redacted, so args cannot leak the key."""

    def __init__(self, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self._redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.msg = self._redactor.redact(message)
        record.args = None
        if record.exc_info:
            # Formatted tracebacks carry exception text: render and redact them now.
            formatter = logging.Formatter()
            record.exc_text = self._redactor.redact(formatter.formatException(record.exc_info))
            record.exc_info = None
        return True


class RedactingStream:
    """A text stream wrapper that redacts everything written through it."""

    def __init__(self, stream: TextIO, redactor: Redactor = REDACTOR) -> None:
        self._stream = stream
        self._redactor = redactor

    def write(self, text: str) -> int:
        return self._stream.write(self._redactor.redact(text))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
