"""Slurm node-list expressions, with the semantics of Slurm 22.05's own hostlist code.

Pure functions only. What Slurm does, established against `scontrol show hostnames`:

* terms are separated by ',', ' ' or '\\t' (a newline is *not* a separator); inside brackets the
  separators do not split a term; empty terms are ignored; order and duplicates are kept;
* ``prefix[r1,r2,...]``: each range is ``N`` or ``LO-HI``; the zero-padding width is the length of the
  text of ``LO`` (``[009-11]`` gives 009 010 011, ``[9-010]`` gives 9 10); ``LO > HI``, an empty range,
  a range of more than 65536 hosts, an ``x`` or a second ``-`` are rejected;
* a term with brackets must end with ``]`` (``n[1-2]-ib`` is rejected by Slurm 22.05);
* several brackets multiply out: with k brackets the last one varies fastest, then the first, second,
  ... up to bracket k-1, which varies slowest (``a[1-2][3-4]`` is a13 a14 a23 a24);
* a term without ``[`` is a host name as written (``node1-5`` is one host), and so is a prefix whose
  brackets do not pair up before the last ``[`` (``a]b[c[1]`` gives ``a]b[c1``).

Deviation, on purpose: Slurm 22.05 turns a ``[`` that is never closed into a mangled name
(``n[1-2`` becomes ``n]``); we reject it instead of handing out a host that does not exist.

Nothing here expands more than it must: :func:`first_host`, :func:`count` and :func:`nth_host` work on
the parsed ranges, so a list of a million hosts costs microseconds and no memory per host.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .errors import HostlistError

MAX_RANGE = 65536  # Slurm: "Too many hosts in range" above this many hosts in one LO-HI range
_SEPARATORS = ",\t "
_ULONG_MAX = 2**64 - 1
_C_SPACE = " \t\n\v\f\r"


# Parsed forms are plain tuples (faster to build than dataclasses, and first_host must cost microseconds):
#   a range  (lo, hi, width)
#   a group  tuple of ranges: one bracket
#   a term   (literals, groups): literals[0] group[0] literals[1] ... group[k-1] literals[k]
_Range = tuple[int, int, int]
_Group = tuple[_Range, ...]
_Term = tuple[tuple[str, ...], tuple[_Group, ...]]


def _group_size(group: _Group) -> int:
    return sum(hi - lo + 1 for lo, hi, _ in group)


def _group_item(group: _Group, i: int) -> str:
    for lo, hi, width in group:
        if i <= hi - lo:
            return f"{lo + i:0{width}d}"
        i -= hi - lo + 1
    raise IndexError(i)


def _group_items(group: _Group) -> list[str]:
    out: list[str] = []
    for lo, hi, width in group:
        out.extend(map(("%0" + str(width) + "d").__mod__, range(lo, hi + 1)))
    return out


def _term_size(term: _Term) -> int:
    n = 1
    for g in term[1]:
        n *= _group_size(g)
    return n


def _loop_order(k: int) -> list[int]:
    # Slurm expands the prefix's brackets from the last to the first as the outer loops and the term's
    # final bracket as the innermost one: order (slowest first) k-2, k-3, ..., 0, k-1.
    return list(range(k)) if k <= 1 else [*range(k - 2, -1, -1), k - 1]


def _term_host(term: _Term, i: int) -> str:
    literals, groups = term
    if not groups:
        return literals[0]
    digits = [0] * len(groups)
    for g_index in reversed(_loop_order(len(groups))):
        i, digits[g_index] = divmod(i, _group_size(groups[g_index]))
    out = [literals[0]]
    for g_index, group in enumerate(groups):
        out.append(_group_item(group, digits[g_index]))
        out.append(literals[g_index + 1])
    return "".join(out)


def _format_range(head: str, lo: int, hi: int, width: int, tail: str) -> list[str]:
    """head + each number of lo..hi zero-padded to width + tail. Builds one string and splits it: about
    twice as fast as formatting host by host, since the cost left is making the str objects."""
    if "\x00" in head or "\x00" in tail:
        return [f"{head}{v:0{width}d}{tail}" for v in range(lo, hi + 1)]
    out: list[str] = []
    top = 10 ** width
    if lo < top:  # zero-padded part: number + 10**width is "1" + the padded digits; drop that "1"
        end = min(hi, top - 1)
        joined = "\x00".join(map(str, range(top + lo, top + end + 1)))
        out = (head + joined[1:].replace("\x001", tail + "\x00" + head) + tail).split("\x00")
        lo = end + 1
    if lo <= hi:  # numbers already at least `width` digits long
        out += (head + (tail + "\x00" + head).join(map(str, range(lo, hi + 1))) + tail).split("\x00")
    return out


def _term_hosts(term: _Term) -> list[str]:
    """All hosts of a term, in Slurm's order."""
    literals, groups = term
    if not groups:
        return [literals[0]]
    k = len(groups)
    outer = _loop_order(k)[:-1]  # slowest first; the last group varies fastest
    values = [_group_items(groups[g]) for g in outer]
    position = {g: i for i, g in enumerate(outer)}
    out: list[str] = []
    for combo in itertools.product(*values):
        head = "".join(literals[g] + combo[position[g]] for g in range(k - 1)) + literals[k - 1]
        for lo, hi, width in groups[-1]:
            out.extend(_format_range(head, lo, hi, width, literals[k]))
    return out


def _strtoul(text: str) -> tuple[int | None, int]:
    """C strtoul(text, &end, 10): (value or None when no digits, index where parsing stopped)."""
    i = 0
    n = len(text)
    while i < n and text[i] in _C_SPACE:
        i += 1
    negative = False
    if i < n and text[i] in "+-":
        negative = text[i] == "-"
        i += 1
    start = i
    while i < n and "0" <= text[i] <= "9":
        i += 1
    if i == start:
        return None, 0
    value = int(text[start:i])
    value = _ULONG_MAX if value > _ULONG_MAX else value
    if negative and value:
        value = (_ULONG_MAX + 1 - value) & _ULONG_MAX
    return value, i


def _parse_range(text: str, expr: str) -> _Range:
    def bad(why: str) -> HostlistError:
        return HostlistError(
            f"invalid node list {expr!r}: {why} in range {text!r} (expected N or LO-HI with LO <= HI)"
        )

    if "x" in text:
        raise bad("unexpected 'x'")
    lo_text, dash, hi_text = text.partition("-")
    if dash and hi_text.startswith("-"):
        raise bad("negative number")
    lo, lo_end = _strtoul(lo_text)
    if lo is None:
        raise bad("no number")
    if dash and hi_text:
        hi, hi_end = _strtoul(hi_text)
        if hi is None or hi_end != len(hi_text):
            raise bad("not a number after '-'")
    else:
        hi = lo
        if lo_end != len(lo_text):
            raise bad("not a number")
    if lo > hi:
        raise bad("LO greater than HI")
    if hi - lo + 1 > MAX_RANGE:
        raise HostlistError(
            f"invalid node list {expr!r}: too many hosts in range {text!r} "
            f"(Slurm allows at most {MAX_RANGE} in one range)"
        )
    return (lo, hi, len(lo_text))


def _parse_group(text: str, expr: str) -> _Group:
    return tuple(_parse_range(part, expr) for part in text.split(","))


def _parse_term(term: str, expr: str) -> _Term:
    if "[" not in term:
        return ((term,), ())
    last_open = term.rfind("[")
    close = term.find("]", last_open)
    if close < 0:
        raise HostlistError(f"invalid node list {expr!r}: '[' without ']' in {term!r}")
    if close != len(term) - 1:
        raise HostlistError(
            f"invalid node list {expr!r}: text after ']' in {term!r} (Slurm requires a term to end with ']')"
        )
    groups = [_parse_group(term[last_open + 1 : close], expr)]
    literals = [""]
    prefix = term[:last_open]
    while True:
        lb = prefix.rfind("[")
        rb = prefix.rfind("]")
        if lb < 0 or rb < lb:
            break  # Slurm keeps such a prefix as written ("a[1]b[c[2]" gives "a[1]b[c2")
        groups.append(_parse_group(prefix[lb + 1 : rb], expr))
        literals.append(prefix[rb + 1 :])
        prefix = prefix[:lb]
    literals.append(prefix)
    return (tuple(reversed(literals)), tuple(reversed(groups)))


def _terms(expr: str) -> Iterator[str]:
    """Split at separators outside brackets, lazily (the first host needs only the first term)."""
    i = 0
    n = len(expr)
    while i < n:
        while i < n and expr[i] in _SEPARATORS:
            i += 1
        if i >= n:
            return
        start = segment = i
        while True:
            while i < n and expr[i] not in _SEPARATORS:
                i += 1
            # Like Slurm: a segment with '[' but no ']' runs on past separators to the next ']'.
            piece = expr[segment:i]
            close = expr.find("]", i) if ("[" in piece and "]" not in piece) else -1
            if close < 0:
                break
            i = segment = close + 1
        yield expr[start:i]


def _parsed(expr: str) -> Iterator[_Term]:
    if not isinstance(expr, str):
        raise HostlistError(f"invalid node list {expr!r}: expected a string")
    for term in _terms(expr):
        yield _parse_term(term, expr)


def iter_hosts(expr: str) -> Iterator[str]:
    """The hosts of ``expr`` in Slurm's order, one term at a time."""
    for term in list(_parsed(expr)):  # validate the whole expression before yielding anything
        yield from _term_hosts(term)


def expand(expr: str) -> list[str]:
    """All hosts of ``expr``, as ``scontrol show hostnames`` prints them."""
    out: list[str] = []
    for term in list(_parsed(expr)):
        out.extend(_term_hosts(term))
    return out


def count(expr: str) -> int:
    """How many hosts ``expr`` names (duplicates counted), without expanding it."""
    return sum(_term_size(t) for t in _parsed(expr))


def first_host(expr: str) -> str:
    """The first host of ``expr``; parses only the first term."""
    for term in _parsed(expr):
        if _term_size(term):
            return _term_host(term, 0)
    raise HostlistError(f"invalid node list {expr!r}: it names no host")


def nth_host(expr: str, index: int) -> str:
    """The host at position ``index`` (0-based), without expanding the list."""
    if index < 0:
        raise HostlistError(f"host index {index} is negative")
    seen = 0
    for term in _parsed(expr):
        size = _term_size(term)
        if index < seen + size:
            return _term_host(term, index - seen)
        seen += size
    raise HostlistError(f"node list {expr!r} has {seen} hosts, no host at index {index}")


def parse_counts(text: str) -> list[tuple[int, int]]:
    """Slurm's compressed counts such as ``2(x3),1`` as (value, repeat) pairs: [(2, 3), (1, 1)].

    Used by SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE.
    """
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        value_text, paren, rest = part.strip().partition("(x")
        repeat_text = "1"
        if paren:
            if not rest.endswith(")"):
                raise HostlistError(f"invalid count list {text!r}: {part!r} (expected N or N(xR))")
            repeat_text = rest[:-1]
        if not (value_text.isascii() and value_text.isdigit() and repeat_text.isascii()
                and repeat_text.isdigit()) or int(repeat_text) < 1:
            raise HostlistError(f"invalid count list {text!r}: {part!r} (expected N or N(xR), e.g. 2(x3),1)")
        pairs.append((int(value_text), int(repeat_text)))
    return pairs


def count_at(pairs: list[tuple[int, int]], index: int) -> int | None:
    """The count for position ``index`` in a parsed count list, or None past its end."""
    for value, repeat in pairs:
        if index < repeat:
            return value
        index -= repeat
    return None


def counts_length(pairs: list[tuple[int, int]]) -> int:
    return sum(r for _, r in pairs)


def counts_total(pairs: list[tuple[int, int]]) -> int:
    return sum(v * r for v, r in pairs)
