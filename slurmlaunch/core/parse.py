"""The parsers of a request's option values, shared by the CLI, the API and validation: Slurm's times,
--array index expressions, --sweep grids, --env items, --nodes N or MIN:MAX. Pure: text in, values out;
every refusal is a SpecError naming the value and what would be valid."""

from __future__ import annotations

import re

from .errors import SpecError
from .limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_ARRAY_INDEX,
    MAX_NODES,
    MAX_TIME_MINUTES,
    bounded_int,
    check_count,
    parse_count,
    shown,
)

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


UNLIMITED = ("UNLIMITED", "INFINITE")


def time_seconds(text: str) -> int | None:
    """A time in one of Slurm's --time formats (already validated) in seconds; None for no limit: UNLIMITED,
    INFINITE, and any time of 0 (sbatch: "A time limit of zero requests that no time limit be imposed")."""
    if text.upper() in UNLIMITED:
        return None
    day_text, dash, rest = text.partition("-")
    parts = [int(p) for p in (rest if dash else text).split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:  # H:M:S
        h, m, s = parts
    else:  # M or M:S
        h, m, s = 0, parts[0], parts[1] if len(parts) == 2 else 0
    return ((int(day_text) if dash else 0) * 86400 + h * 3600 + m * 60 + s) or None


def time_minutes(text: str) -> int | None:
    """Slurm's --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes rounded up; None when malformed."""
    m = _TIME.fullmatch(text)
    if m is None:
        return None
    g = m.groups()
    if g[0] is not None:  # M, M:S, H:M:S
        parts = [p for p in g[:3] if p is not None]
        numbers = [bounded_int(p, MAX_TIME_MINUTES * 60) for p in parts]
        if any(n is None for n in numbers):
            return MAX_TIME_MINUTES + 1
        weights = {1: [60], 2: [60, 1], 3: [3600, 60, 1]}[len(parts)]
    else:  # D-H, D-H:M, D-H:M:S
        parts = [p for p in g[3:] if p is not None]
        numbers = [bounded_int(p, MAX_TIME_MINUTES) for p in parts]
        if any(n is None for n in numbers):
            return MAX_TIME_MINUTES + 1
        weights = [86400, 3600, 60, 1][:len(parts)]
    seconds = sum(n * w for n, w in zip(numbers, weights, strict=True) if n is not None)
    return -(-seconds // 60)


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
