"""`whatif`: predict what a knob change buys, by replaying the measured step."""

from pathlib import Path
from typing import Annotated

import typer

from fsdp_trace.cli.app import outputs_written, user_errors
from fsdp_trace.cli.common import (
    SCHEDULER_HELP,
    announce,
    cluster_client,
    importing_libraries,
    input_files,
    no_cache_if,
    verb,
)
from fsdp_trace.errors import UserError
from fsdp_trace.knobs import KNOB_NAMES


def whatif(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="A capture run directory, or a run's per-rank traces (GPU traces: the replay "
            "needs GPU timing).",
            show_default=False,
            metavar="RUN_OR_TRACES",
        ),
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A change, repeatable: KNOB=VALUE with KNOB one of "
            + ", ".join(KNOB_NAMES)
            + ". Without --set: every change the diagnosis names, ranked.",
            metavar="KNOB=VALUE",
        ),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json",
            help="Write the prediction (measured.step_us, predicted.step_us, "
            "predicted.breakdown, per rank) as JSON to this file.",
            metavar="FILE",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Traces analyzed at once, one per process. Default: a process per core, as "
            "many as half the available memory holds.",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    scheduler: Annotated[
        str | None, typer.Option(help=SCHEDULER_HELP, metavar="ADDRESS", show_default=False)
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the cache.")
    ] = False,
) -> None:
    """Predict what a knob change buys, by replaying the measured step.

    Every rank's measured step is replayed with FSDP2's schedule (per-block compute, the
    transfer times from the cross-rank match, the measured overlap tax, the host's launches
    at its speed without the profiler) under the changed knobs, beside the measured step and
    its split, with an uncertainty. README "What if" gives the model's error on real pairs.
    """
    with user_errors("whatif"), no_cache_if(no_cache):
        import json

        with importing_libraries():
            from fsdp_trace import atomic
            from fsdp_trace import whatif as model
            from fsdp_trace.pipeline import analyze as run_analysis
            from fsdp_trace.present import whatif as views
            from fsdp_trace.render import export
            from fsdp_trace.render.terminal import make_console
            from fsdp_trace.render.whatif import render_prediction, render_ranking

        if jobs is not None and jobs < 1:
            raise UserError(f"--jobs {jobs}: give a number of processes, 1 or more")
        knobs = model.parse(set_) if set_ else None
        inputs = input_files(paths)
        target = Path(json_out) if json_out else None
        export.check_outputs({"--json": target}, {}, inputs=inputs)
        with cluster_client(scheduler, jobs) as client:
            # The replay reads every GPU rank's kernels: kept, not read again.
            result = run_analysis(
                paths,
                jobs=jobs,
                detailed=False,
                cache=not no_cache,
                client=client,
                keep_kernels=True,
            )
        console = make_console()
        payloads = []
        for run in result.runs:
            if knobs is not None:
                prediction = model.predict(run, knobs)
                render_prediction(views.prediction_view(prediction, run.name), console)
                payloads.append(views.payload(prediction, run.name))
            else:
                ranked = model.rank_candidates(run)
                points = views.measured_points(run, result.runs)
                render_ranking(views.ranking_view(ranked, run.name, points), console)
                payloads.append(views.ranking_payload(ranked, run.name))
        if target is not None:
            document = payloads[0] if len(payloads) == 1 else {"runs": payloads}
            try:
                with export.StagedOutputs() as staged:
                    atomic.write_text(
                        staged.file(target), json.dumps(document, indent=1, allow_nan=False) + "\n"
                    )
                    line = f"{verb(target)} {target}"
                    staged.commit()
            except OSError as exc:
                raise UserError(
                    f"--json {target}: cannot write ({exc.strerror or exc}); nothing written"
                ) from None
            announce([line])
        outputs_written()
