"""`view` (a trace served to the Perfetto UI) and the `cache` group (info, clear)."""

from pathlib import Path
from typing import Annotated

import typer

from fsdp_trace.cli.app import PlainCommand, PlainGroup, user_errors
from fsdp_trace.cli.common import importing_libraries
from fsdp_trace.fmt import plural
from fsdp_trace.printable import printable


def view(
    file: Annotated[
        str,
        typer.Argument(
            help="A .pftrace (or any trace) file to open.", show_default=False, metavar="FILE"
        ),
    ],
    port: Annotated[
        int, typer.Option(help="Local port; ui.perfetto.dev loads only from 9001.", metavar="PORT")
    ] = 9001,
    browser: Annotated[bool, typer.Option(help="Open the link in a browser if one exists.")] = True,
    keep_serving: Annotated[
        bool, typer.Option(help="Keep serving after the first download (Ctrl-C stops).")
    ] = False,
) -> None:
    """Serve a trace to the Perfetto UI and print its link.

    FILE is served on 127.0.0.1 with the headers the Perfetto UI needs, and the
    ui.perfetto.dev link that loads it is printed (and opened). On a remote machine:
    ssh -L 9001:127.0.0.1:9001 HOST.
    """
    from fsdp_trace.view import serve

    with user_errors("view"):
        serve(Path(file), port=port, open_browser=browser, once=not keep_serving)


cache_app = typer.Typer(
    help="The cache of parsed traces and analyses (see README 'Cache').",
    no_args_is_help=True,
    cls=PlainGroup,
)


@cache_app.command("info", cls=PlainCommand)
def cache_info() -> None:
    """Where the cache is, how large, and what it holds."""
    with importing_libraries():  # the entries' code versions name numpy's and pandas'
        from fsdp_trace.analysis.read import cache

    with user_errors("cache info"):
        for line in cache.info().lines():
            print(printable(line))


@cache_app.command("clear", cls=PlainCommand)
def cache_clear() -> None:
    """Delete every cache entry (and leftover temporary files)."""
    from fsdp_trace.analysis.read import cachefolder  # the folder alone: no pandas

    with user_errors("cache clear"):
        files, freed = cachefolder.clear()
        print(
            f"fsdp-trace: deleted {plural(files, 'file')} ({freed / 1024**2:,.1f} MiB) "
            f"from {printable(cachefolder.directory())}"
        )
