"""Every table reads at 80 columns, at 120 and piped: no line wider than the terminal, and no
name a user types cut short (a block, a run, a knob, an option): rich alone shrinks columns
below their longest word ("layer…", `--reshard-after-f…`, a compare table collapsed to
"┃┃┃  ┃ tok… ┃"). Where a table cannot fit it wraps its headers, leaves out its `narrow`
columns (said under it) or stacks its rows."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from fsdp_trace.present.view import Table
from fsdp_trace.render.terminal import PIPED_WIDTH, print_table
from tests.conftest import SAMPLES, run_cli

WIDTHS = [80, 120, None]  # None: piped, no COLUMNS
CUT = re.compile(r"\S…")  # rich's ellipsis on a cut word ("layer…"); "…" alone is ours
COLLAPSED = re.compile(r"[┃│] {0,2}[┃│]")  # a column squeezed to nothing


def shown(*args: str, width: int | None) -> str:
    done = run_cli(*args, env={"COLUMNS": str(width)} if width else None)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def check_fits(text: str, width: int) -> None:
    lines = text.splitlines()
    wide = [line for line in lines if cell_len(line.rstrip()) > width]
    assert not wide, f"{len(wide)} lines over {width} columns: {wide[:3]}"
    assert not CUT.search(text), CUT.search(text).group(0)
    assert not any(COLLAPSED.search(line) for line in lines)


def whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", text) is not None


@pytest.fixture(scope="module")
def sample_view():
    import fsdp_trace
    from fsdp_trace.present.view import run_view

    return run_view(fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu").only)


@pytest.mark.parametrize("width", WIDTHS, ids=["80", "120", "piped"])
def test_analyze_fits_and_names_every_block(width, sample_view):
    text = shown("analyze", str(SAMPLES / "gpt-small-2gpu"), "--no-report", width=width)
    check_fits(text, width or PIPED_WIDTH)
    for row in sample_view.blocks.rows:
        assert whole(row[0], text), row[0]
    for row in sample_view.ranks.rows:
        assert whole(row[0], text)
    # The inferred configuration's long sources wrap inside their column.
    assert "(540 per" in text and "median of 2)" in text
    if width == 80:  # the per-block table keeps its rows as rows, without two columns
        assert "(MB, busbw GB/s left out at 80 columns" in text
        assert re.search(r"│ root\s+│ backward │ ReduceScatter │", text), text
    else:
        assert "columns: a wider terminal" not in text and "busbw" in text


LONG = [
    "b4-1gpu-eager-baseline-with-a-rather-long-name",
    "b4-2gpu-eager-reshard-after-forward-false-and-more",
    "b4-2gpu-full-activation-checkpointing-coverage-one",
]


@pytest.mark.parametrize("width", [*WIDTHS, 200], ids=["80", "120", "piped", "200"])
def test_compare_keeps_every_run_name(width, tmp_path):
    """Run names (--label here, long ones) are never cut, at 80 columns, 120, or piped (the
    table was cut at 200 columns)."""
    runs = ("gpt-small-1gpu", "gpt-small-2gpu", "gpt-small-2gpu-fullac")
    labels = [x for label in LONG for x in ("--label", label)]
    text = shown(
        "compare",
        *(str(SAMPLES / r) for r in runs),
        "--no-traces",
        "--html",
        str(tmp_path / "compare.html"),
        *labels,
        width=width,
    )
    check_fits(text, width or 200)
    for label in LONG:
        assert whole(label, text), label
    assert whole("gpt-small-1gpu", text)  # the baseline's name


@pytest.mark.parametrize("width", WIDTHS, ids=["80", "120", "piped"])
def test_capture_help_never_cuts_an_option_name(width):
    from fsdp_trace import cli

    command = cli.capture.capture_command()
    names = [o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    assert "--reshard-after-forward" in names and "--no-shard-embeddings" in names
    text = shown("capture", "--help", width=width)
    check_fits(text, width or 80)  # piped help: typer's own width (80)
    missing = [name for name in names if not whole(name, text)]
    assert not missing, missing


@pytest.mark.parametrize("width", [80, 120])
def test_whatif_ranking_keeps_its_knobs(width):
    text = shown("whatif", str(SAMPLES / "gpt-small-2gpu"), width=width)
    check_fits(text, width)
    assert whole("batch_size=32", text) and whole("prefetch_forward=1", text)


@pytest.mark.parametrize("width", [80, 120])
def test_tune_table_keeps_its_runs(width):
    from fsdp_trace import tune as tuning
    from fsdp_trace.present.tune import numeric
    from fsdp_trace.tune import folder_view

    folder = SAMPLES / "tune-1gpu"
    view = folder_view(tuning.read_tune(folder), folder)
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_table(console, view.table, lambda i: numeric(view.table.headers[i]))
    text = console.file.getvalue()
    check_fits(text, width)
    for row in view.table.rows:
        assert whole(row[1], text), row[1]


# --- the layout itself ------------------------------------------------------------------------

NAMES = ["model.layers.10.attention", "model.layers.2.mlp"]
TABLE = Table(
    "t",
    "A table",
    ["block", "phase", "comm ms (of the step)", "exposed ms", "busbw GB/s"],
    [[n, "forward", "12.34 (56.7 %)", "1.23", "150"] for n in NAMES],
    numeric_from=2,
    narrow=("busbw GB/s",),
)


def laid_out(width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_table(console, TABLE)
    return console.file.getvalue()


@pytest.mark.parametrize("width", [100, 80, 70, 64, 40, 30])
def test_a_table_fits_any_width_and_keeps_its_names(width):
    text = laid_out(width)
    check_fits(text, width)
    for name in NAMES:
        assert whole(name, text), (width, text)
    assert all(whole(v, text) for v in ("12.34", "(56.7 %)", "1.23"))


def test_the_layouts_in_turn():
    """Whole; headers wrapped; a number broken before its parenthesis; the narrow column
    left out (said); stacked."""
    assert "comm ms (of the step)" in laid_out(100)  # whole
    wrapped = laid_out(80)
    assert "12.34 (56.7 %)" in wrapped and "comm ms (of the step)" not in wrapped
    broken = laid_out(70)
    assert "(56.7 %)" in broken and "12.34 (56.7 %)" not in broken and "busbw" in broken
    narrow = laid_out(64)
    assert "(busbw GB/s left out at 64 columns" in narrow and "│ forward" in narrow
    stacked = laid_out(30)
    assert "model.layers.10.attention · forward" not in stacked  # one heading column
    assert re.search(r"^model\.layers\.10\.attention$", stacked, re.MULTILINE), stacked
    assert "busbw GB/s 150" in stacked


def test_a_name_breaks_after_itself_and_its_note_wraps():
    """A name column's cell ("gpt-small-1gpu (differs: ...)") keeps the name whole and wraps
    the note after it: a long note alone never forces the stacked layout."""
    note = "gpt-small-1gpu (differs: AC coverage, batch size, sequence length and dtype)"
    view = Table("n", "Names", ["#", "baseline", "MFU"], [["1", note, "33.0 %"]], names=(1,))
    console = Console(file=io.StringIO(), width=50, color_system=None)
    print_table(console, view, lambda i: i != 1)
    text = console.file.getvalue()
    check_fits(text, 50)
    assert "┃ #" in text and whole("gpt-small-1gpu", text), text  # a table, the name whole
    assert "│ gpt-small-1gpu" in text and "dtype)" in text


def test_whatif_prediction_stays_a_table_at_80():
    """The prediction's rows are labels of the step's parts (no names to keep whole): its
    longest label wraps, and the table stays a table at 80 columns."""
    text = shown("whatif", str(SAMPLES / "gpt-small-2gpu"), "--set", "ac_coverage=1.0", width=80)
    check_fits(text, 80)
    assert re.search(r"│ step +│ +40\.27 ms │", text), text
    assert "│   replay longer than the measured" in text
