"""Where a job's start-up went, per rank: the moments the batch step, the launcher, the rank's runner and the
script recorded (allocation/timeline.py writes them, one small file per rank), turned into phases, a text
chart and an SVG picture. Pure: the files' text in, typed records and text out.

A moment is one line ``TIME_NS HOST KIND[ NAME]``: TIME_NS is time.time_ns() on HOST (each node's wall clock;
clocks of different nodes may disagree by their NTP skew, so a phase that crosses nodes, the batch step's on the
first node to a rank's on another, can be off by it, even negative). KIND is one of KINDS; a "mark" carries the
name the script gave it (``slurmlaunch.mark("first step")``).
"""

from __future__ import annotations

from dataclasses import dataclass

# The kinds of moment, in the order they happen. batch: the batch step started (the batch shell's start, the
# job's first moment in the allocation); step: it started the ranks' command (srun, mpiexec; the local
# scheduler: the rank processes); launch: the rank's launcher process started (the kernel's start time, 10 ms
# ticks); exec: the launcher exec'd the script; torch: `import torch` finished; rendezvous:
# torch.distributed.init_process_group returned; mark: the script's own mark (the first one ends start-up).
BATCH, STEP, LAUNCH, EXEC, TORCH, RENDEZVOUS, MARK = "batch", "step", "launch", "exec", "torch", "rendezvous", "mark"
KINDS = (BATCH, STEP, LAUNCH, EXEC, TORCH, RENDEZVOUS, MARK)
JOB_FILE = "batch"  # the batch step's moments, beside the ranks' files (named by the rank)

# The phase that ends at each kind of moment, as the chart names it, and its letter in the text chart.
PHASE_NAMES = {STEP: "batch step", LAUNCH: "task start", EXEC: "launcher", TORCH: "import torch",
               RENDEZVOUS: "rendezvous", MARK: "to first mark"}
LETTERS = {STEP: "b", LAUNCH: "s", EXEC: "l", TORCH: "t", RENDEZVOUS: "r", MARK: "m"}
COLOURS = {STEP: "#9e9e9e", LAUNCH: "#8d6e63", EXEC: "#42a5f5", TORCH: "#ef5350", RENDEZVOUS: "#ffa726",
           MARK: "#66bb6a"}

# A phase shorter than this below zero is the launch moment's 10 ms tick, not two clocks that disagree.
SKEW_SAID_S = 0.02

# --wait says where start-up went only when it took at least this long: below it nobody waits on it, and a
# short job's start-up is always most of it (a ratio to the elapsed time would flag every test job).
SLOW_STARTUP_S = 30.0


@dataclass(frozen=True)
class Moment:
    kind: str
    time_ns: int
    host: str
    name: str = ""  # a mark's name


@dataclass(frozen=True)
class Phase:
    """One phase of a rank's start-up: ``name`` (PHASE_NAMES, or the mark's name), ``kind`` (the moment it
    ends at), seconds from the job's first moment to its start, and its length."""

    name: str
    kind: str
    start_s: float
    seconds: float


@dataclass(frozen=True)
class RankTimeline:
    rank: int
    host: str
    phases: tuple[Phase, ...]
    moments: tuple[Moment, ...]

    @property
    def end_s(self) -> float:
        """Seconds from the job's first moment to this rank's last phase's end (its start-up done)."""
        return max((p.start_s + p.seconds for p in self.phases), default=0.0)

    @property
    def arrived_s(self) -> float:
        """Seconds from the job's first moment to this rank's last moment before the rendezvous: when it was
        ready to meet the others (the rendezvous and what follows wait for the last rank, so every rank ends its
        start-up about together; the one that came last is the one that held them up)."""
        return max((p.start_s + p.seconds for p in self.phases if p.kind in (STEP, LAUNCH, EXEC, TORCH)),
                   default=0.0)

    def longest(self) -> Phase | None:
        return max(self.phases, key=lambda p: p.seconds, default=None)


@dataclass(frozen=True)
class Timeline:
    """A job's start-up: every rank's phases from the job's first moment (``start_ns``, the batch step's start
    on its node's clock), the slowest rank (the last ready for the rendezvous, then the last done) and its
    longest phase."""

    job_id: str
    start_ns: int
    ranks: tuple[RankTimeline, ...]
    missing: tuple[int, ...]  # ranks of the job that recorded nothing (not started, or not through the launcher)

    @property
    def slowest_rank(self) -> RankTimeline | None:
        return max(self.ranks, key=lambda r: (r.arrived_s, r.end_s, -r.rank), default=None)

    @property
    def slowest_phase(self) -> Phase | None:
        rank = self.slowest_rank
        return rank.longest() if rank else None

    @property
    def seconds(self) -> float:
        """From the job's first moment until the last rank's start-up was done."""
        return max((r.end_s for r in self.ranks), default=0.0)

    def summary(self) -> str:
        """One line: how long start-up took, the slowest rank and its slowest phase."""
        rank, phase = self.slowest_rank, self.slowest_phase
        if rank is None or phase is None:
            return f"job {self.job_id}: no rank recorded its start-up"
        return (f"job {self.job_id}: start-up took {self.seconds:.1f}s; slowest rank {rank.rank} on {rank.host}, "
                f"its slowest phase {phase.name} ({phase.seconds:.1f}s)")

    def data(self) -> dict[str, object]:
        rank, phase = self.slowest_rank, self.slowest_phase
        return {"job_id": self.job_id, "start_ns": self.start_ns, "seconds": round(self.seconds, 6),
                "slowest_rank": rank.rank if rank else None, "slowest_phase": phase.name if phase else None,
                "missing": list(self.missing),
                "ranks": [{"rank": r.rank, "host": r.host, "phases": [
                    {"name": p.name, "kind": p.kind, "start_s": round(p.start_s, 6), "seconds": round(p.seconds, 6)}
                    for p in r.phases]} for r in self.ranks]}


def parse_moments(text: str) -> list[Moment]:
    """The moments in one file's text; a line that is not one (cut short by a full disk, a crash mid-write) is
    skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or not parts[0].isdigit() or parts[2] not in KINDS:
            continue
        out.append(Moment(parts[2], int(parts[0]), parts[1], parts[3] if len(parts) > 3 else ""))
    return out


def _rank_phases(moments: list[Moment], start_ns: int, job: list[Moment]) -> tuple[Phase, ...]:
    """A rank's phases: from the job's moments (batch, step) through its own, each kind once (the first of it;
    the first mark ends start-up, later marks are the script's own business)."""
    firsts: dict[str, Moment] = {}
    for m in sorted([*job, *moments], key=lambda m: KINDS.index(m.kind)):
        firsts.setdefault(m.kind, m)
    ordered = [firsts[k] for k in KINDS if k in firsts]
    phases = []
    for before, after in zip(ordered, ordered[1:], strict=False):
        name = after.name if after.kind == MARK and after.name else PHASE_NAMES[after.kind]
        begin = (before.time_ns - start_ns) / 1e9
        phases.append(Phase(name, after.kind, begin, (after.time_ns - before.time_ns) / 1e9))
    return tuple(phases)


def build(job_id: str, files: dict[str, str], world_size: int | None = None) -> Timeline:
    """The timeline of job ``job_id`` from its timeline directory's files (name -> text: JOB_FILE and one per
    rank, named by the rank). ``world_size``: the ranks that should be there (those missing are named)."""
    job = [m for m in parse_moments(files.get(JOB_FILE, "")) if m.kind in (BATCH, STEP)]
    per_rank: dict[int, list[Moment]] = {}
    for name, text in files.items():
        if name.isdigit() and len(name) < 10:
            moments = [m for m in parse_moments(text) if m.kind not in (BATCH, STEP)]
            if moments:
                per_rank[int(name)] = moments
    every = [m.time_ns for m in job] + [m.time_ns for ms in per_rank.values() for m in ms]
    start_ns = min((m.time_ns for m in job), default=min(every, default=0))
    ranks = []
    for rank in sorted(per_rank):
        moments = per_rank[rank]
        host = next((m.host for m in moments), "?")
        ranks.append(RankTimeline(rank, host, _rank_phases(moments, start_ns, job), tuple(moments)))
    wanted = range(world_size) if world_size is not None else ()
    return Timeline(job_id, start_ns, tuple(ranks), tuple(r for r in wanted if r not in per_rank))


def _seconds(value: float) -> str:
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def chart(timeline: Timeline, width: int = 60) -> str:
    """The text chart: one line per rank, its phases as runs of their letter over a common time axis, its
    start-up time at the end; a legend, the slowest rank and phase, the clock caveat."""
    lines = [timeline.summary()]
    if not timeline.ranks:
        return "\n".join(lines) + "\n"
    total = max(timeline.seconds, 1e-9)
    scale = width / total
    label = max(len(f"rank {r.rank} {r.host}") for r in timeline.ranks)
    for r in timeline.ranks:
        cells = [" "] * width
        for p in r.phases:
            lo = max(0, min(width - 1, round(p.start_s * scale)))
            hi = max(lo + 1, min(width, round((p.start_s + max(p.seconds, 0.0)) * scale)))
            for i in range(lo, hi):
                cells[i] = LETTERS[p.kind]
        met = any(p.kind == RENDEZVOUS for p in r.phases)  # a script without torch.distributed meets nobody
        slowest = ("  <- slowest" + (" (the last ready for the rendezvous)" if met else " (the last done)")
                   if r is timeline.slowest_rank else "")
        lines.append(f"{f'rank {r.rank} {r.host}':<{label}} |{''.join(cells)}| {_seconds(r.end_s)}{slowest}")
    lines.append(f"{'':<{label}}  0{_seconds(total):>{width}}")
    marks = sorted({p.name for r in timeline.ranks for p in r.phases if p.kind == MARK})
    legend = [f"{LETTERS[k]} {PHASE_NAMES[k]}" for k in PHASE_NAMES if k != MARK]
    legend.append(f"{LETTERS[MARK]} to the first mark ({', '.join(marks)})" if marks else
                  f"{LETTERS[MARK]} to the first mark (none: the script calls slurmlaunch.mark('first step'))")
    lines.append("phases: " + "; ".join(legend))
    if timeline.missing:
        shown = ", ".join(map(str, timeline.missing[:20])) + (" ..." if len(timeline.missing) > 20 else "")
        lines.append(f"no moments from rank(s) {shown} (not started, or not through slurmlaunch's launcher)")
    if any(p.seconds < -SKEW_SAID_S for r in timeline.ranks for p in r.phases):
        lines.append("a phase is negative: the nodes' clocks disagree (each moment is its own node's wall clock)")
    else:
        lines.append("each moment is its node's wall clock: across nodes, phases are as exact as the clocks' skew")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg(timeline: Timeline, width: int = 900, row: int = 16) -> str:
    """The picture of the job's start-up: a bar per rank made of its phases, a time axis, a legend and the
    slowest rank and phase in the title. Hand-written SVG 1.1, readable by any browser."""
    left, top, right = 150, 44, 20
    plot = width - left - right
    ranks = timeline.ranks
    height = top + row * max(1, len(ranks)) + 60
    total = max(timeline.seconds, 1e-9)
    scale = plot / total
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="8" y="18" font-size="13" font-weight="bold">{_escape(timeline.summary())}</text>',
           '<text x="8" y="34" fill="#555">each moment is its node\'s wall clock: across nodes, phases are as exact '
           'as the clocks\' skew</text>']
    slowest = timeline.slowest_rank
    for i, r in enumerate(ranks):
        y = top + i * row
        weight = ' font-weight="bold"' if r is slowest else ""
        out.append(f'<text x="{left - 6}" y="{y + row - 4}" text-anchor="end"{weight}>'
                   f'{_escape(f"rank {r.rank} {r.host}")}</text>')
        for p in r.phases:
            x = left + max(0.0, p.start_s) * scale
            w = max(0.5, max(p.seconds, 0.0) * scale)
            out.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 4}" fill="{COLOURS[p.kind]}">'
                       f'<title>{_escape(f"rank {r.rank}: {p.name} {p.seconds:.3f}s")}</title></rect>')
    axis = top + row * max(1, len(ranks)) + 4
    out.append(f'<line x1="{left}" y1="{axis}" x2="{left + plot}" y2="{axis}" stroke="black"/>')
    for k in range(6):
        x = left + plot * k / 5
        out.append(f'<line x1="{x:.2f}" y1="{axis}" x2="{x:.2f}" y2="{axis + 4}" stroke="black"/>')
        out.append(f'<text x="{x:.2f}" y="{axis + 16}" text-anchor="middle">{_seconds(total * k / 5)}</text>')
    x = 8.0
    for kind, name in PHASE_NAMES.items():
        out.append(f'<rect x="{x:.0f}" y="{axis + 28}" width="10" height="10" fill="{COLOURS[kind]}"/>')
        out.append(f'<text x="{x + 14:.0f}" y="{axis + 37}">{_escape(name)}</text>')
        x += 14 + 7 * len(name) + 16
    out.append("</svg>")
    return "\n".join(out) + "\n"


def slow_startup_line(timeline: Timeline, threshold: float = SLOW_STARTUP_S) -> str | None:
    """--wait's one line when start-up took at least ``threshold`` seconds, else None."""
    phase, rank = timeline.slowest_phase, timeline.slowest_rank
    if phase is None or rank is None or timeline.seconds < threshold:
        return None
    return (f"start-up took {timeline.seconds:.0f}s, most of it in {phase.name} ({phase.seconds:.0f}s on rank "
            f"{rank.rank}, {rank.host}): slurmlaunch timeline {timeline.job_id} shows every rank")
