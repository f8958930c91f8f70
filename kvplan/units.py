"""Numbers people type and numbers we print: token counts, byte sizes, fractions (CONTRACTS.md)."""

from __future__ import annotations

import re
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

from kvplan.errors import InputError, shown

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

_TOKEN_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": GiB, "gb": GiB, "gib": GiB,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
# ASCII digits only (int() would read "٤٠٩٦" as 4096); "4,096" as kvplan prints it is accepted
_TOKEN_RE = re.compile(r"^\s*(\d+|\d{1,3}(?:,\d{3})+)\s*([kKmM]?)\s*$", re.ASCII)
MAX_COUNT = 1 << 40  # tokens, requests, GPUs: far beyond any model or deployment (a 5,000-digit value is a typo)
MAX_BYTES = 1 << 60  # 1 EiB
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$", re.ASCII)


def _suffixed_int(text: str | int, what: str, expected: str) -> int:
    """An integer, optionally with k (x1024) or M (x1,048,576); must be > 0."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected {expected}, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _TOKEN_RE.match(str(text))
        if not m:
            raise InputError(f"{what}: {shown(text)} is not {expected}")
        digits = m.group(1).replace(",", "")
        if len(digits.lstrip("0")) > 15:
            raise InputError(f"{what}: {shown(text)} is too large (at most {MAX_COUNT:,})")
        value = int(digits) * _TOKEN_SUFFIX[m.group(2).lower()]
    if value <= 0:
        raise InputError(f"{what}: must be {expected}, got {shown(text)}")
    if value > MAX_COUNT:
        raise InputError(f"{what}: {shown(text)} is too large (at most {MAX_COUNT:,})")
    return value


def parse_tokens(text: str | int, what: str = "token count") -> int:
    """'4096', '32k', '1M' -> tokens (k = 1024, M = 1,048,576). Must be > 0."""
    return _suffixed_int(text, what, "a positive token count such as 4096, 32k or 1M (no decimals with a suffix)")


def parse_count(text: str | int, what: str) -> int:
    """A positive integer (batch sizes, GPU counts, tp/pp); k/M suffixes accepted as for tokens."""
    return _suffixed_int(text, what, "a positive integer")


def parse_bytes(text: str | int, what: str = "size") -> int:
    """'24GB', '80GiB', '512 MiB', '5.01GiB' -> bytes. All units binary; decimals floored to whole bytes."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a size like 24GB, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _BYTES_RE.match(str(text))
        if m and len(m.group(1).split(".")[0].lstrip("0")) > 19:
            raise InputError(f"{what}: {shown(text)} is too large (at most 1 EiB)")
        unit = m.group(2).lower() if m else None
        if not m or unit not in _BYTE_UNITS:
            raise InputError(
                f"{what}: {shown(text)} is not a size; use a number with B, KB/KiB, MB/MiB, GB/GiB or TB/TiB "
                "(all binary), e.g. 24GB, 80GiB, 512MiB"
            )
        try:
            number = Decimal(m.group(1))
        except InvalidOperation:  # pragma: no cover - regex guarantees a number
            raise InputError(f"{what}: {text!r} is not a size") from None
        value = int((number * _BYTE_UNITS[unit]).to_integral_value(rounding=ROUND_FLOOR))
    if value <= 0:
        raise InputError(f"{what}: must be a positive size, got {shown(text)}")
    if value > MAX_BYTES:
        raise InputError(f"{what}: {shown(text)} is too large (at most 1 EiB)")
    return value


def parse_fraction(text: str | float, what: str = "fraction") -> float:
    """'0.9' or '90%' -> 0.9; must lie in (0, 1]."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a fraction like 0.9 or 90%, got {text!r}")
    try:
        if isinstance(text, (int, float)):
            value = float(text)
        else:
            s = str(text).strip()
            if not s.isascii() or len(s) > 40:
                raise ValueError(s)
            value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise InputError(f"{what}: {shown(text)} is not a fraction; use e.g. 0.9 or 90%") from None
    if not (0 < value <= 1):  # NaN fails this too
        raise InputError(f"{what}: {shown(text)} is outside (0, 1]; use e.g. 0.9 or 90%")
    return value


def parse_ratio(text: str | float, what: str = "ratio") -> float:
    """'0.9' or '1.5' -> a positive ratio of two amounts (no upper bound below 1000)."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a positive ratio like 0.9 or 1.5, got {text!r}")
    try:
        if isinstance(text, (int, float)):
            value = float(text)
        else:
            t = str(text).strip()
            if not t.isascii() or len(t) > 40:  # as parse_fraction: a long text is refused, never cut
                raise ValueError(t)
            value = float(t)
    except ValueError:
        raise InputError(f"{what}: {shown(text)} is not a ratio; use e.g. 0.9 or 1.5") from None
    if not (0 < value < 1000):  # NaN and inf fail this too
        raise InputError(f"{what}: {shown(text)} is outside (0, 1000); use e.g. 0.9 or 1.5")
    return value


def parse_headroom(text: str | float, what: str = "headroom") -> float:
    """Like a fraction but 0 is allowed and 1 is not: the share of a budget held back."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and float(text) == 0:
        return 0.0
    if isinstance(text, str) and text.strip() in ("0", "0%", "0.0"):
        return 0.0
    value = parse_fraction(text, what)
    if value >= 1:
        raise InputError(f"{what}: {shown(text)} would hold back the whole budget; use a value in [0, 1)")
    return value


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|us)?\s*$", re.ASCII | re.IGNORECASE)
_BANDWIDTH_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(gb/s|tb/s|gbps)?\s*$", re.ASCII | re.IGNORECASE)


def parse_seconds(text: str, what: str) -> float:
    """A time: 30ms, 0.05s, 30 (milliseconds when no unit); > 0 and below an hour."""
    m = _DURATION_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: {shown(text)} is not a time; write 30ms or 0.05s")
    value = float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "us": 1e-6, None: 1e-3}[(m.group(2) or "").lower() or None]
    if not 0 < value < 3600:
        raise InputError(f"{what}: {shown(text)} is out of range (above 0, below an hour)")
    return value


def parse_rate(text: str, what: str) -> float:
    """Requests per second: 2, 0.5, 120/s; above 0 and at most 1,000,000."""
    m = re.match(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:/s|rps|req/s)?\s*$", str(text), re.ASCII | re.IGNORECASE)
    if not m:
        raise InputError(f"{what}: {shown(text)} is not a rate; write requests per second such as 2 or 0.5")
    value = float(m.group(1))
    if not 0 < value <= 1e6:
        raise InputError(f"{what}: {shown(text)} is out of range (above 0, at most 1,000,000 per second)")
    return value


def parse_bandwidth(text: str, what: str) -> float:
    """Memory bandwidth in bytes/s from GB/s (1e9 B/s, as vendors state it): 3350, 3350GB/s, 3.35TB/s."""
    m = _BANDWIDTH_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: {shown(text)} is not a bandwidth; write GB/s such as 3350 or 3.35TB/s")
    value = float(m.group(1)) * (1e12 if (m.group(2) or "").lower() == "tb/s" else 1e9)
    if not 1e8 <= value <= 1e15:
        raise InputError(f"{what}: {shown(text)} is out of range (0.1 GB/s to 1 PB/s)")
    return value


def fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def fmt_bytes(n: int | None) -> str:
    """Human size in binary units with two decimals (GiB = 2^30)."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"

