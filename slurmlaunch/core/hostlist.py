"""Slurm node-list expressions, with the semantics of Slurm 22.05's own hostlist code.

Pure functions only. What Slurm does, established against `scontrol show hostnames`:

* terms are separated by ',', ' ' or '\\t' (a newline is *not* a separator); a separator between a '['
  and its ']' does not split a term, in any bracket of the term (``rack[1-2]-node[01,03]`` is one term);
  empty terms are ignored; order and duplicates are kept;
* a bracket holds ranges separated by ','; each range is ``N`` or ``LO-HI``; the zero-padding width is
  the length of the text of ``LO`` (``[009-11]`` gives 009 010 011, ``[9-010]`` gives 9 10); ``LO > HI``,
  an empty range, a range of more than 65536 hosts, an ``x`` or a second ``-`` are rejected;
* a term with brackets must end with ``]`` (``n[1-2]-ib`` is rejected by Slurm 22.05);
* several brackets multiply out: with k brackets the last one varies fastest, then the first, second,
  ... up to bracket k-1, which varies slowest (``a[1-2][3-4]`` is a13 a14 a23 a24); a bracket that is
  not the last of its term may name at most 65536 hosts, all its ranges together;
* a term without ``[`` is a host name as written (``node1-5`` is one host), and so is a prefix whose
  brackets do not pair up before the last ``[`` (``a]b[c[1]`` gives ``a]b[c1``);
* numbers are C ``unsigned long``: a number above 2**64-1 becomes 18446744073709551615, zero-padded to the
  width of its text, in a bracket and in the digits that end a host name alike; a range of several
  hosts that reaches 2**64-1 crashes scontrol, and 2**64-1 in a bracket before the last one makes it
  loop for ever.

Deviations, on purpose (each one refuses a list instead of handing out a host that does not exist, or
bounds what an input may cost; the docs' node-list section (explanation: the launcher) gives the reasons):

* Slurm 22.05 turns a ``[`` that is never closed into a mangled name (``n[1-2`` becomes ``n]``);
  we reject it;
* numbers above 2**64-1 (in a bracket or ending a name) and the ranges that crash or hang Slurm (above)
  are refused;
* Slurm 22.05 loses an error in a bracket third from last or earlier: it logs it, drops the term and
  goes on (``a[x]b[1]c[2],d`` gives ``d``); we reject the list;
* a number in a bracket may be written with at most MAX_DIGITS digits, leading zeros included;
* an expression may be at most MAX_EXPRESSION characters long;
* :func:`expand` and :func:`iter_hosts` build at most MAX_EXPAND_HOSTS hosts and MAX_EXPAND_CHARS
  characters of names, checked before anything is built; Slurm has no such bound (its host count is a C
  int and ``a[0-65535]b[0-65535]`` exhausts its memory).

Nothing here expands more than it must: :func:`first_host`, :func:`count` and :func:`nth_host` work on
the parsed ranges, so a list of a billion hosts costs microseconds and no memory per host.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .errors import HostlistError

# Slurm 22.05's own limits (src/common/hostlist.c, hostlist.h): a list past one of them is invalid there too.
MAX_RANGE = 65536  # hosts in one LO-HI range (Slurm: "Too many hosts in range")
MAX_PREFIX_HOSTS = 65536  # hosts of a bracket that is not the last of its term (Slurm: MAX_PREFIX_CNT)
# Ours, where Slurm has none (the docs' "Node lists" says why these numbers):
MAX_DIGITS = 64  # digits of one number in a bracket: HOST_NAME_MAX on Linux, no host name is longer
MAX_EXPRESSION = 131072  # characters: MAX_ARG_STRLEN, the longest argv or environment string Linux passes
MAX_EXPAND_HOSTS = 1 << 20  # hosts that expand()/iter_hosts() build: 100x the largest Slurm machine's nodes
MAX_EXPAND_CHARS = 1 << 26  # characters of host names they build (64 MiB, 64 per host at the host bound)

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


def _show(text: str) -> str:
    """The value for a one-line message: whole when short, its start and length when not."""
    if len(text) <= 120:
        return repr(text)
    return f"{text[:60]!r}... ({len(text)} characters)"


def _group_size(group: _Group) -> int:
    return sum(hi - lo + 1 for lo, hi, _ in group)


def _group_chars(group: _Group) -> int:
    """Characters of all the numbers of a group, as printed (a number is at least `width` wide)."""
    total = 0
    for lo, hi, width in group:
        digits = len(str(lo))
        while lo <= hi:
            end = min(hi, 10**digits - 1)
            total += (end - lo + 1) * max(width, digits)
            lo = end + 1
            digits += 1
    return total


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


def _term_chars(term: _Term) -> int:
    literals, groups = term
    n = _term_size(term)
    return n * sum(map(len, literals)) + sum(n // _group_size(g) * _group_chars(g) for g in groups)


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


def _term_chunks(term: _Term) -> Iterator[list[str]]:
    """The hosts of a term in Slurm's order, at most one range (MAX_RANGE hosts) at a time."""
    literals, groups = term
    if not groups:
        yield [literals[0]]
        return
    k = len(groups)
    outer = _loop_order(k)[:-1]  # slowest first; the last group varies fastest
    values = [_group_items(groups[g]) for g in outer]
    position = {g: i for i, g in enumerate(outer)}
    for combo in itertools.product(*values):
        head = "".join(literals[g] + combo[position[g]] for g in range(k - 1)) + literals[k - 1]
        for lo, hi, width in groups[-1]:
            yield _format_range(head, lo, hi, width, literals[k])


def _strtoul(text: str, expr: str) -> tuple[int | None, int]:
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
    if i - start > MAX_DIGITS:  # before int(): Python refuses to convert more than 4300 digits
        raise HostlistError(
            f"invalid node list {_show(expr)}: a number of {i - start} digits ({_show(text[start:i])}); "
            f"a number in a node list has at most {MAX_DIGITS} digits"
        )
    value = int(text[start:i])
    if value > _ULONG_MAX:
        raise HostlistError(
            f"invalid node list {_show(expr)}: the number {_show(text[start:i])} is above 2**64-1 "
            "(Slurm would clamp it to 18446744073709551615, a host that does not exist)"
        )
    if negative and value:
        value = (_ULONG_MAX + 1 - value) & _ULONG_MAX
    return value, i


def _parse_range(text: str, expr: str, last: bool) -> _Range:
    def bad(why: str) -> HostlistError:
        return HostlistError(
            f"invalid node list {_show(expr)}: {why} in range {_show(text)} (expected N or LO-HI with LO <= HI)"
        )

    if "x" in text:
        raise bad("unexpected 'x'")
    lo_text, dash, hi_text = text.partition("-")
    if dash and hi_text.startswith("-"):
        raise bad("negative number")
    lo, lo_end = _strtoul(lo_text, expr)
    if lo is None:
        raise bad("no number")
    if dash and hi_text:
        hi, hi_end = _strtoul(hi_text, expr)
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
            f"invalid node list {_show(expr)}: too many hosts in range {_show(text)}: {hi - lo + 1} "
            f"(Slurm allows at most {MAX_RANGE} in one range)"
        )
    if hi == _ULONG_MAX and (lo < hi or not last):
        # Slurm counts up past the top: scontrol crashes on such a range, or loops for ever on a bracket
        # before the last. 2**64-1 alone in the last bracket it handles.
        raise bad("a range reaching 2**64-1 (Slurm 22.05 crashes or hangs on it)")
    return (lo, hi, len(lo_text))


def _parse_group(text: str, expr: str, last: bool) -> _Group:
    # Slurm's other bracket bound, 65536 ranges, needs more than MAX_EXPRESSION characters to reach.
    group = tuple(_parse_range(part, expr, last) for part in text.split(","))
    if not last and _group_size(group) > MAX_PREFIX_HOSTS:
        raise HostlistError(
            f"invalid node list {_show(expr)}: the bracket [{_show(text)[1:-1]}] names {_group_size(group)} "
            f"hosts (Slurm allows at most {MAX_PREFIX_HOSTS} in a bracket that is not the last of its term)"
        )
    return group


def _bare_host(name: str, expr: str) -> str:
    """A name without '[', which Slurm prints as written unless the digits that end it exceed a C
    unsigned long: those it clamps to 2**64-1, a host that does not exist, so we refuse them."""
    i = len(name)
    while i > 0 and "0" <= name[i - 1] <= "9":
        i -= 1
    significant = name[i:].lstrip("0")
    if len(significant) > 20 or (len(significant) == 20 and int(significant) > _ULONG_MAX):
        raise HostlistError(
            f"invalid node list {_show(expr)}: the host name {_show(name)} ends in a number above 2**64-1 "
            "(Slurm would clamp it to 18446744073709551615)"
        )
    return name


def _parse_term(term: str, expr: str) -> _Term:
    last_open = term.rfind("[")
    if last_open < 0:
        return ((_bare_host(term, expr),), ())
    close = term.find("]", last_open)
    if close < 0:
        raise HostlistError(f"invalid node list {_show(expr)}: '[' without ']' in {_show(term)}")
    if close != len(term) - 1:
        raise HostlistError(
            f"invalid node list {_show(expr)}: text after ']' in {_show(term)} "
            "(Slurm requires a term to end with ']')"
        )
    groups = [_parse_group(term[last_open + 1 : close], expr, last=True)]
    literals = [""]
    prefix = term[:last_open]
    while True:
        lb = prefix.rfind("[")
        rb = prefix.rfind("]")
        if lb < 0 or rb < lb:
            break  # Slurm keeps such a prefix as written ("a[1]b[c[2]" gives "a[1]b[c2")
        groups.append(_parse_group(prefix[lb + 1 : rb], expr, last=False))
        literals.append(prefix[rb + 1 :])
        prefix = prefix[:lb]
    literals.append(prefix)
    return (tuple(reversed(literals)), tuple(reversed(groups)))


def _terms(expr: str) -> Iterator[str]:
    """Split at separators the way Slurm's tokenizer does, lazily (the first host needs only the first
    term): a term runs on past a separator that lies between a '[' and the first ']' after it."""
    n = len(expr)
    i = 0
    close = -2  # the first ']' at or after `parse` (-1: none left); positions only grow, so it is cached
    while True:
        while i < n and expr[i] in _SEPARATORS:
            i += 1
        if i >= n:
            return
        start = parse = end = i
        while True:
            while end < n and expr[end] not in _SEPARATORS:
                end += 1
            extended = False
            while True:
                opening = expr.find("[", parse, end)
                if opening < 0:
                    break
                if close == -2 or 0 <= close < parse:
                    close = expr.find("]", parse)
                if close < opening:  # none left, or a stray ']' first: the term ends here
                    break
                if close < end:  # this pair is closed inside the piece: look for the next one
                    parse = close + 1
                    continue
                end = close  # closed past a separator: the term runs on
                extended = True
                break
            if not extended:
                break
        yield expr[start:end]
        i = end


def _parsed(expr: str) -> Iterator[_Term]:
    if not isinstance(expr, str):
        raise HostlistError(f"invalid node list {expr!r}: expected a string")
    if len(expr) > MAX_EXPRESSION:
        raise HostlistError(
            f"node list {_show(expr)} is {len(expr)} characters long; at most {MAX_EXPRESSION} are accepted "
            "(the longest string Linux passes in an argument or an environment variable)"
        )
    for term in _terms(expr):
        yield _parse_term(term, expr)


def _bounded(expr: str) -> list[_Term]:
    """All terms of ``expr``, after checking that expanding them stays within the expansion bounds."""
    terms = list(_parsed(expr))
    hosts = sum(map(_term_size, terms))
    if hosts > MAX_EXPAND_HOSTS:
        raise HostlistError(
            f"node list {_show(expr)} names {hosts} hosts, too many to list (at most {MAX_EXPAND_HOSTS}; "
            "counting them or taking the first needs no listing)"
        )
    chars = sum(map(_term_chars, terms))
    if chars > MAX_EXPAND_CHARS:
        raise HostlistError(
            f"node list {_show(expr)} names hosts of {chars} characters in all, too many to list "
            f"(at most {MAX_EXPAND_CHARS})"
        )
    return terms


def iter_hosts(expr: str) -> Iterator[str]:
    """The hosts of ``expr`` in Slurm's order; the whole expression and the bounds are checked before the
    first host comes out, then hosts are made one range at a time."""
    for term in _bounded(expr):
        for chunk in _term_chunks(term):
            yield from chunk


def expand(expr: str) -> list[str]:
    """All hosts of ``expr``, as ``scontrol show hostnames`` prints them (at most MAX_EXPAND_HOSTS)."""
    out: list[str] = []
    for term in _bounded(expr):
        for chunk in _term_chunks(term):
            out.extend(chunk)
    return out


def count(expr: str) -> int:
    """How many hosts ``expr`` names (duplicates counted), without expanding it."""
    return sum(_term_size(t) for t in _parsed(expr))


def first_host(expr: str) -> str:
    """The first host of ``expr``; parses only the first term."""
    for term in _parsed(expr):
        if _term_size(term):
            return _term_host(term, 0)
    raise HostlistError(f"invalid node list {_show(expr)}: it names no host")


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
    raise HostlistError(f"node list {_show(expr)} has {seen} hosts, no host at index {index}")


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
