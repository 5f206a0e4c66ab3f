"""Ranks' Python stacks, as faulthandler writes them, read and grouped. Pure: text in, values out.

A dump (``faulthandler.dump_traceback(all_threads=True)``, which the launcher's RUNNER arms on a signal) is a
block per thread, most recent call first::

    Thread 0x00007f3c8e7fc640 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 324 in wait
    <blank>
    Current thread 0x00007f3c9a4b3740 (most recent call first):
      File "/home/u/train.py", line 57 in step
      File "<string>", line 70 in <module>

CPython lists the newest thread first, so the main thread is the last block. Its outermost frame is the
RUNNER's own (``<string>`` in ``<module>``): that line ends a complete dump. Ranks whose main-thread stacks
are the same are one group; the odd ones out come first, with their node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \"[^\"]*\")? \(most recent call first\):$|"
                     r"^(Stack) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
RUNNER_FILE = "<string>"  # the RUNNER runs as `python -c`: its frames, and any `-c` code's, are named so


@dataclass(frozen=True)
class Frame:
    file: str
    line: int  # 0 when faulthandler did not know it ("???")
    function: str

    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Thread:
    ident: str  # "0x7f3c9a4b3740" ("" for a single-thread dump)
    current: bool  # the thread that took the signal (not necessarily the main one)
    frames: tuple[Frame, ...]  # most recent call first
    truncated: bool = False  # faulthandler stops at 100 frames ("  ...")


def complete(text: str) -> bool:
    """Whether ``text`` ends with a whole dump: its last line is the RUNNER's outermost frame (the main thread,
    listed last, has run to its bottom)."""
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    m = _FRAME.match(last)
    return m is not None and m.group(1) == RUNNER_FILE and m.group(3) == "<module>"


def parse(text: str) -> list[Thread]:
    """The threads of the last dump in ``text`` (a file may hold several, one after another: a thread id seen
    twice starts the next dump); lines that are not faulthandler's are skipped."""
    dumps: list[list[Thread]] = [[]]
    frames: list[Frame] = []
    ident, current, truncated, open_block = "", False, False, False

    def close() -> None:
        if open_block:
            dumps[-1].append(Thread(ident, current, tuple(frames), truncated))

    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            close()
            ident = head.group(2) or ""
            current = head.group(1) == "Current thread"
            if ident and any(t.ident == ident for t in dumps[-1]):
                dumps.append([])
            frames, truncated, open_block = [], False, True
            continue
        m = _FRAME.match(line)
        if m and open_block:
            frames.append(Frame(m.group(1), int(m.group(2)) if m.group(2).isdigit() else 0, m.group(3)))
        elif line.strip() == "..." and open_block:
            truncated = True
    close()
    return next((d for d in reversed(dumps) if d), [])


def _library(path: str) -> bool:
    return "/site-packages/" in path or "/dist-packages/" in path or bool(re.search(r"/lib/python3\.\d+/", path)) \
        or path.startswith("<frozen ")


def shown_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The frames that are the job's: without the RUNNER's (``<string>``) and runpy's, at the bottom."""
    kept = list(frames)
    while kept and (kept[-1].file == RUNNER_FILE or kept[-1].file.startswith("<frozen ")
                    or kept[-1].file.endswith("/runpy.py")):
        kept.pop()
    return tuple(kept)


def summary(frames: Sequence[Frame], source: Callable[[str, int], str | None] | None = None) -> str:
    """One line for a stack: the innermost frame of the job's own code (not in site-packages or the standard
    library), its source line when ``source`` can read it, then the innermost call it made into a library:
    ``train.py:57 in step: dist.all_reduce(t) -> all_reduce (distributed_c10d.py:2801)``."""
    kept = shown_frames(frames)
    if not kept:
        return "no Python frame (the main thread has ended, or is outside Python)"
    own = next((f for f in kept if not _library(f.file)), kept[0])
    text = own.where()
    line = source(own.file, own.line) if source is not None and own.line else None
    if line:
        text += f": {line.strip()[:120]}"
    if own is not kept[0]:
        text += f" -> {kept[0].function} ({kept[0].file.rsplit('/', 1)[-1]}:{kept[0].line})"
    return text


@dataclass(frozen=True)
class RankStacks:
    """One rank's answer: its threads (main thread last), or why there are none (``problem``)."""

    rank: int
    host: str  # "" when not known
    threads: tuple[Thread, ...] = ()
    problem: str | None = None  # "not reached: node2 did not answer within 30s", ...

    @property
    def main(self) -> Thread | None:
        return self.threads[-1] if self.threads else None


@dataclass(frozen=True)
class Group:
    """Ranks with the same main-thread stack (or the same problem), and the line that says so."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]  # the ranks' nodes, in rank order ("" where unknown)
    frames: tuple[Frame, ...]  # the main thread's, as shown (empty for a problem)
    line: str  # "ranks 0-2,4-7: train.py:57 in step -> all_reduce (...)"
    problem: str | None = None
    odd: bool = False  # not the largest group: printed first, with the nodes


def ranges(numbers: Iterable[int]) -> str:
    """``0-2,4,6-7`` for 0, 1, 2, 4, 6, 7."""
    out: list[str] = []
    values = sorted(set(numbers))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def _who(ranks: Sequence[int], hosts: Sequence[str], with_nodes: bool) -> str:
    name = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
    nodes = sorted({h for h in hosts if h})
    if with_nodes and nodes:
        name += f" on {','.join(nodes[:8])}" + (f" (+{len(nodes) - 8} nodes)" if len(nodes) > 8 else "")
    return name


@dataclass(frozen=True)
class Grouping:
    groups: tuple[Group, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        return [g.line for g in self.groups]


def group(answers: Sequence[RankStacks], source: Callable[[str, int], str | None] | None = None) -> Grouping:
    """The ranks grouped by their main thread's stack (as shown) or their problem. Order: problems first,
    then the smaller groups (the odd ones out, with their nodes), the largest group last; ties by lowest
    rank. A group larger than every other is named without nodes (it is most of the job); every other one
    with them."""
    buckets: dict[object, list[RankStacks]] = {}
    for a in sorted(answers, key=lambda a: a.rank):
        main = a.main
        key: object = ("problem", a.problem) if a.problem is not None or main is None else \
            ("stack", shown_frames(main.frames))
        buckets.setdefault(key, []).append(a)
    stacks = [k for k in buckets if k[0] == "stack"]  # type: ignore[index]
    sizes = sorted((len(buckets[k]) for k in stacks), reverse=True)
    # the largest group is "the rest" only when it is larger than every other: among equals none is odd-free
    largest = next((k for k in stacks if len(buckets[k]) == sizes[0]), None) \
        if sizes and (len(sizes) == 1 or sizes[0] > sizes[1]) else None
    groups: list[tuple[tuple[int, int, int], Group]] = []
    for key, members in buckets.items():
        ranks = tuple(a.rank for a in members)
        hosts = tuple(a.host for a in members)
        odd = key != largest
        if key[0] == "problem":  # type: ignore[index]
            problem = members[0].problem or "no stack in the dump"
            line = f"{_who(ranks, hosts, True)}: {problem}"
            groups.append(((0, len(ranks), ranks[0]), Group(ranks, hosts, (), line, problem, True)))
            continue
        frames = key[1]  # type: ignore[index]
        line = f"{_who(ranks, hosts, odd)}: {summary(frames, source)}"
        groups.append(((1 if odd else 2, len(ranks), ranks[0]), Group(ranks, hosts, frames, line, None, odd)))
    return Grouping(tuple(g for _, g in sorted(groups, key=lambda e: e[0])))


def render_stack(frames: Sequence[Frame], indent: str = "    ") -> list[str]:
    """A stack as lines, most recent call first, as faulthandler wrote it."""
    return [f'{indent}File "{f.file}", line {f.line} in {f.function}' for f in frames]


def to_data(grouping: Grouping, answers: Sequence[RankStacks]) -> dict[str, object]:
    """The grouping and every rank's threads as JSON-ready data (`stacks --json`, job.stacks())."""

    def frames(fs: Sequence[Frame]) -> list[dict[str, object]]:
        return [{"file": f.file, "line": f.line, "function": f.function} for f in fs]

    return {
        "groups": [{"ranks": list(g.ranks), "hosts": list(g.hosts), "line": g.line, "odd": g.odd,
                    "problem": g.problem, "frames": frames(g.frames)} for g in grouping.groups],
        "ranks": [{"rank": a.rank, "host": a.host, "problem": a.problem,
                   "threads": [{"ident": t.ident, "current": t.current, "main": i == len(a.threads) - 1,
                                "truncated": t.truncated, "frames": frames(t.frames)}
                               for i, t in enumerate(a.threads)]} for a in sorted(answers, key=lambda a: a.rank)],
    }
