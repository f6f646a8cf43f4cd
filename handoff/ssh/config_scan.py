"""Which names ssh_config could tell apart: the Host patterns of the files `ssh -G` reads.

handoff.ssh.ssh_config asks `ssh -G` what ssh would use for a name: one fork of ssh per
name, 5-8 ms of CPU each, so a third of a 32-host no-op deploy's own work on the
workstation was spent asking ssh the same question 32 times. For a fleet listed by address
(the inventory's usual form) no Host block names any of them: every one gets the settings
of a name no pattern singles out, with its own address, port and user. This module finds
out, from the config files alone, whether two names fall under exactly the same Host
lines; ssh_config then asks ssh once for a reference name and gives that answer to every
name in the same position, after checking with a second `ssh -G` that no setting depends
on the name, port or user (a `%h` token).

It never decides what a setting is (ssh does, as before), only whether two names must get
the same answer, and it is conservative: a Match block (its criteria need ssh to evaluate),
CanonicalizeHostname, an Include with tokens or environment variables, an unreadable file,
Includes nested deeper than ssh allows, or a line it cannot split make `scan` return None,
and every name asks ssh itself.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import dataclass
from functools import cache

SYSTEM_DIR = "/etc/ssh"
MAX_DEPTH = 16  # ssh's own limit on nested Include (READCONF_MAX_DEPTH)
_LINE = re.compile(r"\s*([^\s=]+)\s*(?:=\s*)?(.*)$")


class _Unsure(Exception):
    """Something in the files this module does not follow: every name asks ssh."""


@dataclass(frozen=True)
class Scan:
    """Every Host line of the config files, in order: each a tuple of its patterns."""

    host_lines: tuple[tuple[str, ...], ...]

    def same(self, a: str, b: str) -> bool:
        """True when no Host line can tell `a` and `b` apart (each line matches both or
        neither, whether ssh compares cases or not)."""
        for patterns in self.host_lines:
            first, second = _line_matches(patterns, a), _line_matches(patterns, b)
            if first is None or second is None or first != second:
                return False
        return True


def scan(files: list[str], homes: list[str]) -> Scan | None:
    """The Host lines of `files` and of everything they Include, or None when the files
    hold anything this module does not follow. ssh resolves a relative Include under
    ~/.ssh (or /etc/ssh in the system file) and `~/` under the home: every one of `homes`
    is tried (both $HOME and the passwd home when they differ); reading a file too many
    can only make fewer names share an answer."""
    bases = [*(os.path.join(h, ".ssh") for h in homes), SYSTEM_DIR]
    lines: list[tuple[str, ...]] = []
    try:
        for path in files:
            _read(path, bases, lines, 0)
    except _Unsure:
        return None
    return Scan(tuple(lines))


def _read(path: str, bases: list[str], lines: list[tuple[str, ...]], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Unsure(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        return  # ssh skips a config file that is not there
    except OSError as exc:
        raise _Unsure(path) from exc
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if not m or m.group(1).startswith("#"):
            continue
        keyword = m.group(1).lower()
        if keyword not in ("host", "match", "include", "canonicalizehostname"):
            continue
        try:
            args = shlex.split(m.group(2), comments=True)
        except ValueError as exc:
            raise _Unsure(raw) from exc
        if keyword == "host":
            patterns = tuple(p for arg in args for p in arg.split(",") if p)
            if not patterns:
                raise _Unsure(raw)
            lines.append(patterns)
        elif keyword == "include":
            for arg in args:
                for found in _included(arg, bases):
                    _read(found, bases, lines, depth + 1)
        elif keyword == "canonicalizehostname":
            if not args or args[0].lower() != "no":
                raise _Unsure(raw)  # a name may become another before the blocks apply
        else:
            raise _Unsure(raw)  # Match: only ssh evaluates its criteria


def _included(arg: str, bases: list[str]) -> list[str]:
    if "%" in arg or "$" in arg or (arg.startswith("~") and not arg.startswith("~/")):
        raise _Unsure(arg)  # tokens, environment variables, another user's home
    if arg.startswith("~/"):
        candidates = [os.path.join(os.path.dirname(base), arg[2:])
                      for base in bases if base != SYSTEM_DIR]
    elif os.path.isabs(arg):
        candidates = [arg]
    else:
        candidates = [os.path.join(base, arg) for base in bases]
    found: list[str] = []
    for candidate in dict.fromkeys(candidates):
        for path in sorted(glob.glob(candidate)):
            if os.path.isdir(path):
                raise _Unsure(path)
            found.append(path)
    return found


@cache
def _pattern(pattern: str, fold: bool) -> re.Pattern[str]:
    """ssh's pattern: `*` any run of characters, `?` one character, the rest literal."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body + r"\Z", re.DOTALL | (re.IGNORECASE if fold else 0))


def _matches(pattern: str, name: str, fold: bool) -> bool:
    if "*" not in pattern and "?" not in pattern:  # most Host lines name one host
        return pattern.lower() == name.lower() if fold else pattern == name
    return _pattern(pattern, fold).match(name) is not None


def _line_matches(patterns: tuple[str, ...], name: str) -> bool | None:
    """Whether a Host line applies to `name` (a `!pattern` that matches excludes it), or
    None when that depends on whether ssh compares cases."""
    results = set()
    cased = name != name.lower() or any(p != p.lower() for p in patterns)
    for fold in (False, True) if cased else (False,):
        hit = False
        for p in patterns:
            negated = p.startswith("!")
            if _matches(p[1:] if negated else p, name, fold):
                if negated:
                    hit = False
                    break
                hit = True
        results.add(hit)
    return results.pop() if len(results) == 1 else None


__all__ = ["Scan", "scan"]
