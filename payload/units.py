"""How durations, sizes and ETAs are written for people: one formatter each, used by the
payload's progress lines and by handoff's tables, so a figure reads the same everywhere."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """`42s`, `7m05s`, `3h12m`: short, sortable by eye, never a float with decimals."""
    if seconds is None or seconds != seconds or seconds < 0:  # None, NaN or negative
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta(left: float | None, rate: float | None) -> str:
    """Time to finish `left` items at `rate` items per second; `-` when unknown."""
    if left is None or not rate or rate <= 0:
        return "-"
    if left <= 0:
        return "0s"
    return duration(left / rate)


def size(n: float | None) -> str:
    """Bytes in decimal units (as `df -H` and disk vendors count): `512 B`, `1.3 MB`."""
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def rate(bytes_per_s: float | None) -> str:
    return "-" if not bytes_per_s else f"{size(bytes_per_s)}/s"
