"""Cross-check against Holistic Trace Analysis' `get_comm_comp_overlap` on the same trace.

HTA publishes as `traceinsight` (0.6.1) since `holistictraceanalysis` 0.5.0; both install the
module `hta`, with the same `TraceAnalysis(trace_files=...).get_comm_comp_overlap()`, so either
works, whichever is importable; `hta_tool()` says which ("traceinsight 0.6.1"), and the table
(column `tool`) and a notice name it. They cannot be installed side by side: pip installs the
second over the first's files, and removing either removes `hta`. One difference matters here:
traceinsight reads HTA_DISABLE_NS_ROUNDING once, into `HTAEnvOptions`, so the rounding is set
there too (`_ns_rounding`). Its figures are those of 0.5.0 (tested on the same traces).

HTA 0.5.0's figure is |U(comm) ∩ U(compute)| / |U(comm)| over one window per rank: kernels
whose launch starts before the last `ProfilerStep` (the last step is dropped; nothing is
clipped to step boundaries), comm/compute told apart by kernel name, and, when timestamps
carry ns fractions, every event rounded inward to whole µs. `overlap_with_hta_rules` applies
that window to our own kernel classes with exact timestamps, so it must equal HTA run with
`HTA_DISABLE_NS_ROUNDING=1` wherever the kernel classes coincide.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from fsdp_trace.analysis import classify
from fsdp_trace.analysis.rank.analyze import Coverage, overlap_pct
from fsdp_trace.analysis.rank.context import name_mask
from fsdp_trace.analysis.read.loader import Trace, load_trace
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of

# The distributions that provide the module `hta`, the successor first.
HTA_PACKAGES = ("traceinsight", "holistictraceanalysis")
NOT_INSTALLED = (
    "--hta: HTA is not installed: pip install traceinsight (HTA's successor; or "
    "holistictraceanalysis, not both: they install the same module)"
)


def hta_tool() -> str | None:
    """Which HTA `import hta` gives, as "PACKAGE VERSION" ("traceinsight 0.6.1",
    "holistictraceanalysis 0.5.0"): the installed distribution whose `hta/__init__.py` is the
    one found first; None when there is no `hta` to import."""
    try:
        spec = importlib.util.find_spec("hta")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin).resolve()
    for name in HTA_PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Path(str(dist.locate_file("hta/__init__.py"))).resolve() == origin:
            return f"{name} {dist.version}"
    try:  # an `hta` from elsewhere (a source checkout): its own version
        from hta import __version__
    except Exception:
        __version__ = "(version unknown)"
    return f"hta {__version__} ({origin.parent})"


def hta_window(trace: Trace, kinds: np.ndarray) -> np.ndarray:
    """Which events HTA 0.5.0's overlap reads: GPU events launched (by correlation) from a CPU
    row that starts before the last `ProfilerStep` — every GPU event when the trace has fewer
    than two ProfilerStep names (HTA then filters nothing)."""
    events = trace.events
    is_gpu = classify.kind_mask(kinds, *classify.GPU_KINDS)
    is_profiler_step = name_mask(events["name"], lambda n: "ProfilerStep" in n)
    keep = is_gpu.copy()
    if events["name"][is_profiler_step].astype(str).nunique() >= 2:
        # HTA treats every non-kernel row as a CPU op, GPU-side ProfilerStep annotations too.
        correlation = array_of(events, "correlation")
        cpu = ~is_gpu
        cutoff = array_of(events, "ts")[cpu & is_profiler_step].max()
        launched = np.unique(
            correlation[cpu & (array_of(events, "ts") < cutoff) & (correlation >= 0)]
        )
        keep &= np.isin(correlation, launched)
    return keep


def overlap_with_hta_rules(trace: Trace) -> float:
    """Our overlap % over HTA's kernel window (exact timestamps): the main analysis' classifier
    and `Coverage`, measured over one window spanning every kept event."""
    events = trace.events
    kinds = classify.event_kinds(events)
    keep = hta_window(trace, kinds)
    if not keep.any():
        return float("nan")
    ts, end = array_of(events, "ts")[keep], array_of(events, "end")[keep]
    figures = Coverage.of(ts, end, kinds[keep]).in_windows(
        np.array([ts.min()]), np.array([end.max()])
    )
    return float(overlap_pct(figures["comm_us"], figures["overlap_us"])[0])


@contextlib.contextmanager
def _ns_rounding(rounding: bool) -> Iterator[None]:
    """HTA rounding ns timestamps inward to whole µs (its default) or not, for the duration:
    holistictraceanalysis 0.5.0 reads HTA_DISABLE_NS_ROUNDING at each use; traceinsight 0.6
    reads it once into `HTAEnvOptions`, which is set as well. Both are restored after."""
    try:
        from hta.configs.env_options import HTAEnvOptions

        options = HTAEnvOptions.instance()  # first use: reads the user's setting
        before = options.disable_ns_rounding()
    except (ImportError, AttributeError):
        options = before = None
    previous = os.environ.get("HTA_DISABLE_NS_ROUNDING")
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "0" if rounding else "1"
    if options is not None:
        options.set_disable_ns_rounding(not rounding)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
        else:
            os.environ["HTA_DISABLE_NS_ROUNDING"] = previous
        if options is not None:
            options.set_disable_ns_rounding(before)


def hta_overlap(path: str | Path, rank: int, rounding: bool = True) -> float:
    """HTA's own figure for one trace file (traceinsight or holistictraceanalysis must be
    installed)."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    from hta.trace_analysis import TraceAnalysis

    with (
        _ns_rounding(rounding),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),  # pandas' warnings about HTA's code, arrays and all
    ):
        warnings.simplefilter("ignore")
        analysis = TraceAnalysis(trace_files={rank: str(Path(path).resolve())})
        frame = analysis.get_comm_comp_overlap(visualize=False)
    return float(frame.loc[frame["rank"] == rank, "comp_comm_overlap_pctg"].iloc[0])


NOTICE_REASON_MAX = 100  # characters of an HTA error kept in its notice
_LONG_QUOTE = re.compile(r"'[^']{40,}'|\"[^\"]{40,}\"|\[[^\[\]]{40,}\]")


def _one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and its message with whitespace collapsed,
    long quoted values (HTA's errors quote whole arrays, over many lines) shown as '…', cut
    to NOTICE_REASON_MAX characters."""
    text = _LONG_QUOTE.sub("'…'", " ".join(str(exc).split()))
    if len(text) > NOTICE_REASON_MAX:
        text = text[: NOTICE_REASON_MAX - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _pandas_hint() -> str:
    """Where pandas 3 is installed: that HTA needs pandas 2 (the `hta` extra pins it)."""
    major = pd.__version__.split(".", 1)[0]
    if not major.isdigit() or int(major) < 3:
        return ""
    return " (HTA needs pandas<3: pip install 'fsdp-trace[hta]')"


def cross_check(ranks: list[RankAnalysis], cache: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """HTA's figure beside ours for each GPU rank (column `tool`: which HTA ran, as
    `hta_tool()` says); notices: which HTA ran, and what could not run."""
    tool = hta_tool()
    if tool is None:
        return pd.DataFrame(), [NOT_INSTALLED]
    try:
        import hta  # noqa: F401
    except Exception as exc:
        return pd.DataFrame(), [f"--hta: {tool} cannot be imported: {_one_line(exc)}"]
    rows, notices = [], [f"HTA cross-check: {tool}"]
    for r in ranks:
        if r.device != "gpu" or r.collectives.empty:
            continue
        rank = r.rank if r.rank is not None else 0
        steps = r.steps
        comm = steps["comm_us"].sum()
        ours_steps = 100.0 * steps["overlap_us"].sum() / comm if comm else float("nan")
        try:
            hta_pct = hta_overlap(r.path, rank)
        except Exception as exc:  # HTA is a peer tool: its failure is a notice, not ours
            where = f"rank {rank} ({Path(r.path).name})"
            notices.append(f"--hta: HTA failed on {where}: {_one_line(exc)}{_pandas_hint()}")
            continue
        rows.append(
            {
                "rank": rank,
                "path": r.path,
                "tool": tool,
                "hta_pct": hta_pct,
                "ours_hta_rules_pct": overlap_with_hta_rules(load_trace(r.path, cache=cache)),
                "ours_steps_pct": ours_steps,
            }
        )
    if not rows and len(notices) == 1:
        notices[0] += " — no GPU rank with collectives to check"
    return pd.DataFrame(rows), notices
