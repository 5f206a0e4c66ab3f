"""The parsers of a request's option values, shared by the CLI, the API, validation, the scripts and the
local scheduler, each written once: Slurm's times, --mem sizes, --signal NAME[@SECONDS], --array index
expressions, --sweep grids, --env items, --nodes N or MIN:MAX. Pure: text in, values out;
every refusal is a SpecError naming the value and what would be valid."""

from __future__ import annotations

import re

from .errors import SpecError
from .limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_ARRAY_INDEX,
    MAX_MEM_BYTES,
    MAX_NODES,
    MAX_TIME_MINUTES,
    bounded_int,
    check_count,
    parse_count,
    shown,
)
from .signals import WARNING_SIGNALS as WARNING_SIGNALS  # the table is there: the launcher's path reads it

# Every pattern is used with fullmatch and [0-9]: `$` also matches before a trailing newline (which then
# reached the script as a line of its own), and \d matches any script's digits, not only ASCII ones.
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (and the unlimited spellings). Slurm bounds no
# field: it adds them up (parse_time.c's time_str2secs; its unit test reads 1:60:15 as 2 h 0 min 15 s), so
# 1:99 is 1 min 99 s, as sbatch reads it, not an error. Two digits per field is ours.
_TIME = re.compile(r"([0-9]+)(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?|([0-9]+)-([0-9]{1,2})(?::([0-9]{1,2}))?"
                   r"(?::([0-9]{1,2}))?")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Slurm's --array indices: 0-15, 1,3,5-7, 0-15:4 (the %N limit is --max-parallel).
_ARRAY_PART = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_SWEEP_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Slurm's --mem: an integer and an optional unit K, M, G or T (powers of 1024); no unit is M.
_MEM = re.compile(r"([0-9]+)([KMGT]?)", re.IGNORECASE)
DEFAULT_WARNING_SECONDS = 90  # how long before the time limit the warning comes when --signal names no time


UNLIMITED = ("UNLIMITED", "INFINITE")


def _seconds(text: str) -> int | None:
    """A time in one of Slurm's --time formats in seconds; None when malformed. A field too long to be a time
    Slurm keeps counts as one minute more than MAX_TIME_MINUTES (no digit string is converted whole)."""
    m = _TIME.fullmatch(text)
    if m is None:
        return None
    g = m.groups()
    if g[0] is not None:  # M, M:S, H:M:S
        parts = [p for p in g[:3] if p is not None]
        bound = MAX_TIME_MINUTES * 60
        weights = {1: [60], 2: [60, 1], 3: [3600, 60, 1]}[len(parts)]
    else:  # D-H, D-H:M, D-H:M:S
        parts = [p for p in g[3:] if p is not None]
        bound = MAX_TIME_MINUTES
        weights = [86400, 3600, 60, 1][:len(parts)]
    numbers = [bounded_int(p, bound) for p in parts]
    if any(n is None for n in numbers):
        return (MAX_TIME_MINUTES + 1) * 60
    return sum(n * w for n, w in zip(numbers, weights, strict=True) if n is not None)


def not_a_time(text: str) -> SpecError:
    return SpecError(f"--time {shown(text)} is not a time Slurm accepts "
                     f"(expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")


def time_seconds(text: str) -> int | None:
    """A time in one of Slurm's --time formats in seconds; None for no limit: UNLIMITED, INFINITE, and any
    time of 0 (sbatch: "A time limit of zero requests that no time limit be imposed"). SpecError when it is
    no time."""
    if text.upper() in UNLIMITED:
        return None
    seconds = _seconds(text)
    if seconds is None:
        raise not_a_time(text)
    return seconds or None


def time_minutes(text: str) -> int | None:
    """Slurm's --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes rounded up; None when malformed."""
    seconds = _seconds(text)
    return None if seconds is None else -(-seconds // 60)


def _mem_shift(unit: str) -> int:
    return 10 * ("KMGT".index(unit) + 1)  # bytes = amount << this


def parse_mem(text: str) -> tuple[int, str]:
    """--mem as (amount, unit): the unit one of K, M, G, T (powers of 1024), M when none is written, as Slurm
    reads it. SpecError when it is no size, or more than MAX_MEM_BYTES."""
    m = _MEM.fullmatch(text)
    if m is None:
        raise SpecError(f"--mem {shown(text)} is not valid (expected a size such as 4000, 16G or 512M)")
    unit = (m.group(2) or "M").upper()
    amount = bounded_int(m.group(1), MAX_MEM_BYTES)
    if amount is None or amount << _mem_shift(unit) > MAX_MEM_BYTES:
        raise SpecError(f"--mem {shown(text)} is more than any node has (expected at most 1 EiB, e.g. 512G)")
    return amount, unit


def mem_mb(text: str) -> int:
    """--mem in megabytes, as SLURM_MEM_PER_NODE gives it (kilobytes rounded up)."""
    amount, unit = parse_mem(text)
    return -(-(amount << _mem_shift(unit)) >> 20)


def parse_signal(text: str | None) -> tuple[str, int] | None:
    """--signal [B:]NAME[@SECONDS] as (NAME without SIG, in capitals; seconds before the time limit, default
    DEFAULT_WARNING_SECONDS); None for no warning (none, or nothing). SpecError unless NAME is one of
    WARNING_SIGNALS and SECONDS 0..65535 (Slurm: "sig_time must have an integer value between 0 and 65535").
    The one reader of a --signal spelling: every other room takes its NAME (docs/explanation/architecture.md,
    "--signal, room by room"). ``B:`` (sbatch's spelling) is what every script asks for anyway; Slurm's signal
    numbers are refused, since they differ between systems (USR1 is 10 on Linux, 30 on macOS)."""
    if not text or text.lower() == "none":
        return None
    name, _, when = text.removeprefix("B:").removeprefix("b:").partition("@")
    name = name.upper().removeprefix("SIG")
    seconds = bounded_int(when, 65535) if when else DEFAULT_WARNING_SECONDS
    if name in WARNING_SIGNALS and seconds is None:
        raise SpecError(f"--signal {shown(text)} is not valid (expected SECONDS 0..65535 after @, as Slurm "
                        f"allows, e.g. {name}@90)")
    if name not in WARNING_SIGNALS or seconds is None:
        number = " (a name, not a number: signal numbers differ between systems)" if name.isdigit() else ""
        raise SpecError(f"--signal {shown(text)} is not valid (expected NAME[@SECONDS] with NAME one of "
                        f"{', '.join(WARNING_SIGNALS)}, e.g. USR2@90; or none){number}")
    return name, seconds


def signal_number(name: str) -> int:
    """The number of the warning signal ``name`` as parse_signal gives it (USR2: 12 on Linux), on this system:
    the one place a --signal name becomes a signal (the batch step, the local scheduler). SpecError for a
    name parse_signal does not give."""
    if name not in WARNING_SIGNALS:
        raise SpecError(f"warning signal {shown(name)} is not valid (expected one of {', '.join(WARNING_SIGNALS)})")
    import signal  # here: `signal` loads enum, and the launcher's path imports this module's neighbours only

    return int(signal.Signals["SIG" + name])


def parse_env(items: list[str]) -> tuple[tuple[str, str], ...]:
    """--env KEY=VALUE items; the value is kept byte for byte (it may hold '=', quotes, newlines)."""
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not ENV_KEY.fullmatch(key):
            raise SpecError(
                f"--env {shown(item)} is not valid (expected KEY=VALUE with KEY a shell variable name, e.g. FOO=1)"
            )
        out.append((key, value))
    return tuple(out)


def array_ranges(text: str) -> list[range]:
    """Slurm's --array index expression as ranges, checked (indices up to Slurm's largest MaxArraySize - 1,
    at most MAX_ARRAY_ELEMENTS in all) without expanding it; SpecError when malformed or too large."""
    ranges: list[range] = []
    total = 0
    for part in text.split(","):
        m = _ARRAY_PART.fullmatch(part)
        if m is None:
            raise SpecError(f"--array {shown(text)} is not valid (expected indices such as 0-9, 1,3,5-7 or "
                            f"0-15:4; the concurrency limit is --max-parallel N)")
        first, last, step = (None if g is None else bounded_int(g, MAX_ARRAY_INDEX) for g in m.groups())
        if first is None or (m.group(2) and last is None) or (m.group(3) and step is None):
            raise SpecError(f"--array {shown(text)} is not valid (indices go up to {MAX_ARRAY_INDEX}: Slurm's "
                            f"MaxArraySize may not exceed {MAX_ARRAY_INDEX + 1})")
        if (last is not None and last < first) or step == 0:
            raise SpecError(f"--array {shown(text)} is not valid (expected indices such as 0-9, 1,3,5-7 or "
                            f"0-15:4, each range from low to high)")
        r = range(first, (last if last is not None else first) + 1, step or 1)
        total += len(r)
        if total > MAX_ARRAY_ELEMENTS:
            raise SpecError(f"--array {shown(text)} names more than {MAX_ARRAY_ELEMENTS} elements (expected at "
                            f"most {MAX_ARRAY_ELEMENTS}: each element is a whole distributed job; docs: Limits)")
        ranges.append(r)
    return ranges


def parse_array(text: str) -> list[int]:
    """Slurm's --array index expression, expanded (sorted, without repeats); SpecError when malformed."""
    out: set[int] = set()
    for r in array_ranges(text):
        out.update(r)
    return sorted(out)


def parse_sweep(items: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """--sweep KEY=V1,V2,... items, in order; each value reaches SCRIPT as --KEY=VALUE, byte for byte."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        key, eq, values = item.partition("=")
        parts = tuple(values.split(","))
        if not eq or not _SWEEP_KEY.fullmatch(key) or any(not v for v in parts):
            raise SpecError(f"--sweep {shown(item)} is not valid (expected KEY=V1,V2,... with non-empty values, "
                            f"e.g. lr=0.1,0.01)")
        if key in dict(out):
            raise SpecError(f"--sweep {key} is given twice (give all its values in one --sweep {key}=V1,V2)")
        out.append((key, parts))
    points = 1
    for _, grid_values in out:  # checked before the grid is built: its size is the product
        points *= len(grid_values)
        if points > MAX_ARRAY_ELEMENTS:
            raise SpecError(f"--sweep: the grid has more than {MAX_ARRAY_ELEMENTS} points (expected at most "
                            f"{MAX_ARRAY_ELEMENTS}: one distributed job each, all listed in the script; "
                            f"docs: Limits)")
    return tuple(out)


def parse_nodes(text: str | int) -> tuple[int, int | None]:
    """--nodes N or (torchrun mode) MIN:MAX -> (N or MAX, MIN or None)."""
    if isinstance(text, int) and not isinstance(text, bool):  # the Python API and TOML profiles
        check_count("--nodes", text, 1, MAX_NODES)
        return text, None
    value = str(text)
    low, colon, high = value.partition(":")
    if not colon and re.fullmatch(r"-?[0-9]+", value):
        return parse_count("--nodes", value, 1, MAX_NODES, hint="; or MIN:MAX with --mode torchrun"), None
    if not colon:
        raise SpecError(f"--nodes {shown(value)} is not valid (expected a number of nodes, or MIN:MAX with "
                        f"--mode torchrun)")
    nodes, minimum = bounded_int(high, MAX_NODES), bounded_int(low, MAX_NODES)
    if nodes is None or minimum is None:
        raise SpecError(f"--nodes {shown(value)} is not valid (expected a number of nodes, or MIN:MAX with "
                        f"--mode torchrun, each at most {MAX_NODES})")
    if not 1 <= minimum <= nodes:  # the same line as validate's, said before anything else is read
        raise SpecError(f"--nodes {value} is not valid (expected MIN:MAX with 1 <= MIN <= MAX)")
    return nodes, minimum
