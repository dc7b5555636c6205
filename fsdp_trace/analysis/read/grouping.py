"""Group trace files into runs by what they carry, not by their names.

Traces given without a run.json (a directory of a torchtitan profile, tensorboard_trace_handler
files named `host_pid.<n>.pt.trace.json.gz`, two runs' traces side by side) are told apart by:
- the job: world size and the process groups (`distributedInfo`: their descriptions and
  sizes), which every rank of one job shares;
- the time: ranks of one profile cover the same steps, so their windows on the absolute
  clock (`baseTimeNanoseconds` + `ts`) overlap; another run, or another profiled iteration of
  the same job, lies elsewhere in time;
- the rank (`distributedInfo.rank`, else the file name): one trace per rank in a run;
- how it was profiled: detailed traces (record_shapes → `Input Dims`, with_stack → Python
  stack events) next to a lean profile of the same job that holds their ranks, taken within
  minutes before it (as `fsdp-trace capture` writes them) or after it (a script that keeps
  detailed traces for a few ranks only), are that run's detailed traces: one run, timing
  read from the lean ones only; a detailed trace with no lean partner is the user's own
  timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_trace.analysis.results import RankAnalysis

# How far apart (on the absolute clock) two traces of one profile may start and end: ranks
# on other hosts run on other clocks (NTP keeps them within milliseconds), and a rank's window
# starts where its own first kernel does. Beyond this they are other profiles.
SAME_PROFILE_SLACK_NS = 2_000_000_000  # 2 s
# A capture's detailed trace precedes its timing trace by warmup and a barrier: seconds.
DETAILED_BEFORE_NS = 600_000_000_000  # 10 minutes


@dataclass
class Member:
    index: int  # position in the analyses list
    analysis: RankAnalysis
    job: tuple
    start: float  # absolute ns
    end: float
    detailed: bool


@dataclass
class Group:
    """One profile's traces: its window (the members' earliest start, latest end) and ranks
    kept as members join, since every member that joins reads them (recomputed from the
    members, they made grouping a thousand ranks a million steps)."""

    members: list[Member] = field(default_factory=list)
    detailed: list[Member] = field(default_factory=list)
    start: float = math.inf
    end: float = -math.inf
    ranks: set = field(default_factory=set)

    def add(self, member: Member) -> None:
        """`member` joins: the window as `min`/`max` over the members in order would give."""
        first = not self.members
        self.members.append(member)
        if first or member.start < self.start:
            self.start = member.start
        if first or member.end > self.end:
            self.end = member.end
        self.ranks.add(member.analysis.rank)


def job_key(a: RankAnalysis) -> tuple:
    """What every rank of one job shares: the world size and its process groups' kinds and
    sizes (each rank lists only its own groups, so members are left out)."""
    distributed = a.meta.get("distributed") or {}
    groups = distributed.get("pg_config") if isinstance(distributed, dict) else None
    kinds = set()
    for pg in groups if isinstance(groups, list) else []:
        if isinstance(pg, dict):
            size = pg.get("pg_size") or len(pg.get("ranks") or [])
            kinds.add((str(pg.get("pg_desc") or ""), int(size) if isinstance(size, int) else 0))
    return (a.meta.get("world_size"), tuple(sorted(kinds)))


def window(a: RankAnalysis) -> tuple[float, float]:
    """The trace's profiled steps on the absolute clock, ns."""
    base = float(a.meta.get("base_time_ns") or 0)
    steps = a.steps
    if steps.empty:
        return base, base
    return base + 1e3 * float(steps["start_us"].min()), base + 1e3 * float(steps["end_us"].max())


def is_detailed(a: RankAnalysis) -> bool:
    return bool(a.meta.get("record_shapes") or a.meta.get("with_stack"))


def _cluster(members: list[Member]) -> list[Group]:
    """Members of one job and kind, by time: each joins the group its window overlaps (with
    slack) unless that group already holds its rank."""
    groups: list[Group] = []
    for m in sorted(members, key=lambda m: (m.start, m.index)):
        home = next(
            (
                g
                for g in groups
                if m.start <= g.end + SAME_PROFILE_SLACK_NS
                and m.end >= g.start - SAME_PROFILE_SLACK_NS
                and (m.analysis.rank is None or m.analysis.rank not in g.ranks)
            ),
            None,
        )
        if home is None:
            home = Group()
            groups.append(home)
        home.add(m)
    return groups


def _gap(detailed: Group, lean: Group) -> float:
    """ns between a detailed profile and a lean one, whichever came first (a capture takes
    its detailed step just before its timing steps; a training script may profile a few
    ranks in detail after the lean profile of every rank)."""
    if detailed.end <= lean.start:
        return lean.start - detailed.end
    return detailed.start - lean.end


def group(analyses: list[RankAnalysis]) -> list[tuple[list[int], list[int]]]:
    """Runs among `analyses` (traces given without run.json): per run, the indices of its
    timing traces and of its detailed ones, runs in the order of their first trace given."""
    members = []
    for i, a in enumerate(analyses):
        start, end = window(a)
        members.append(Member(i, a, job_key(a), start, end, is_detailed(a)))
    jobs: dict[tuple, list[Member]] = {}
    for m in members:
        jobs.setdefault(m.job, []).append(m)
    runs: list[Group] = []
    for job_members in jobs.values():
        lean = _cluster([m for m in job_members if not m.detailed])
        detailed = _cluster([m for m in job_members if m.detailed])
        for d in detailed:  # beside the nearest lean profile of the same job holding its ranks
            partner = min(
                (
                    g
                    for g in lean
                    if not g.detailed
                    and d.ranks <= g.ranks
                    and -SAME_PROFILE_SLACK_NS <= _gap(d, g) <= DETAILED_BEFORE_NS
                ),
                key=lambda g: abs(_gap(d, g)),
                default=None,
            )
            if partner is None:
                lean.append(d)  # the user's own profile: its timing is what they have
            else:
                partner.detailed = d.members
        runs += lean
    runs.sort(key=lambda g: min(m.index for m in g.members + g.detailed))

    def by_rank(members: list[Member]) -> list[int]:
        rank = lambda m: (m.analysis.rank is None, m.analysis.rank or 0, m.index)  # noqa: E731
        return [m.index for m in sorted(members, key=rank)]

    return [(by_rank(g.members), by_rank(g.detailed)) for g in runs]


def run_name(paths: list[Path], taken: set[str]) -> str:
    """A run's name from its files: their common folder, else "traces"; numbered when two
    runs would share one."""
    parents = {p.parent for p in paths}
    name = next(iter(parents)).name if len(parents) == 1 else "traces"
    name = name or "traces"
    if name not in taken:
        return name
    n = 2
    while f"{name} #{n}" in taken:
        n += 1
    return f"{name} #{n}"
