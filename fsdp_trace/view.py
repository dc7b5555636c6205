"""`fsdp-trace view FILE`: open a trace in ui.perfetto.dev, served from this machine.

The UI fetches `?url=` traces from the browser, and its content security policy lets it reach
only `http://127.0.0.1:9001` (the port of trace_processor's RPC server) among local addresses,
so the file is served there, with CORS for the UI's origin. At start-up the UI probes
`POST /status` on that port for a trace_processor; the probe gets a 404, which sends it on to
the `?url=` load. Nothing but the one file is served. On a remote machine, forward the port
(`ssh -L 9001:127.0.0.1:9001 HOST`) and open the printed link locally.
"""

from __future__ import annotations

import errno
import http.server
import os
import shutil
import sys
import threading
import webbrowser
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from fsdp_trace.errors import UserError

UI_ORIGIN = "https://ui.perfetto.dev"
HOST = "127.0.0.1"
PORT = 9001  # the only local port the UI's CSP (connect-src) lets ?url= reach


def ui_url(filename: str, port: int = PORT) -> str:
    """The ui.perfetto.dev link that loads `filename` from this machine's server."""
    return f"{UI_ORIGIN}/#!/?url=http://{HOST}:{port}/{quote(filename)}"


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /<file name> → the file; anything else (POST /status included) → 404."""

    server: _HttpServer
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers

    def _headers(self, status: int, length: int) -> None:
        self.send_response(status)
        self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
        self.send_header("Cache-Control", "no-cache")
        if status == 200:
            self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _not_found(self) -> None:
        self._headers(404, 0)

    def _is_file(self) -> bool:
        return unquote(urlsplit(self.path).path) == "/" + self.server.trace.name

    def _send_file(self, body: bool) -> None:
        trace = self.server.trace
        try:
            handle = trace.open("rb")
        except OSError:
            self._not_found()
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            self._headers(200, size)
            if body:
                try:
                    shutil.copyfileobj(handle, self.wfile, 1 << 20)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the browser gave up: not served
                self.server.served += 1

    def do_GET(self) -> None:
        if self._is_file():
            self._send_file(body=True)
        else:
            self._not_found()

    def do_HEAD(self) -> None:
        if self._is_file():
            self._send_file(body=False)
        else:
            self._not_found()

    def do_POST(self) -> None:  # the UI's trace_processor probe (POST /status)
        self._not_found()

    do_PUT = do_DELETE = do_OPTIONS = do_PATCH = do_POST

    def log_message(self, format: str, *args) -> None:  # quiet: the CLI prints what matters
        pass


class _HttpServer(http.server.HTTPServer):
    # SO_REUSEADDR: rebinding right after a previous run works; a live listener still clashes.
    # (On Windows the option would let two servers share the port, so it stays off there.)
    allow_reuse_address = os.name != "nt"

    def __init__(self, trace: Path, port: int) -> None:
        self.trace = trace
        self.served = 0
        super().__init__((HOST, port), _Handler)


class TraceServer:
    """Serves one trace file on 127.0.0.1:`port` for ui.perfetto.dev.

    Binding happens here: a port in use raises UserError. `serve(once=True)` answers requests
    until the file has been sent once; `start()` / `stop()` run it in a thread (tests)."""

    def __init__(self, path: str | Path, port: int = PORT) -> None:
        path = Path(path)
        if not path.exists():
            raise UserError(f"{path}: no such file")
        if not path.is_file():
            raise UserError(f"{path}: not a file")
        self.path = path.resolve()
        try:
            self._server = _HttpServer(self.path, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {HOST} is in use (another `fsdp-trace view`, or a "
                    "trace_processor --httpd?): stop it and retry; ui.perfetto.dev loads "
                    f"local traces from port {PORT} only"
                ) from None
            raise UserError(f"cannot listen on {HOST}:{port} ({exc.strerror})") from None
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def file_url(self) -> str:
        return f"http://{HOST}:{self.port}/{quote(self.path.name)}"

    @property
    def url(self) -> str:
        return ui_url(self.path.name, self.port)

    @property
    def served(self) -> int:
        """How many times the file has been sent in full."""
        return self._server.served

    def serve(self, once: bool = True) -> None:
        """Answer requests: until the file has been sent once, or until interrupted."""
        if once:
            while self._server.served == 0:
                self._server.handle_request()
        else:
            self._server.serve_forever()

    def start(self) -> TraceServer:
        """Serve in a daemon thread until `stop()`."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fsdp-trace-view", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> TraceServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def open_in_browser(url: str) -> bool:
    """Open `url` in a graphical browser when there is one; False otherwise.

    Console browsers (lynx, w3m: what `webbrowser` falls back to on a headless machine) are
    skipped, they cannot run the UI and would take over the terminal; $BROWSER is honoured."""
    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    if type(browser) is webbrowser.GenericBrowser and not os.environ.get("BROWSER"):
        return False
    try:
        return bool(browser.open_new_tab(url))
    except OSError:
        return False


def port_warning(port: int) -> str | None:
    """What to tell a user who serves on another port than the one the UI accepts."""
    if port == PORT:
        return None
    return (
        f"warning: ui.perfetto.dev loads ?url= traces only from {HOST}:{PORT} (its content "
        f"security policy): the link below, on port {port}, will be refused. Use --port {PORT}, "
        f"or forward {PORT} to this port: `ssh -L {PORT}:{HOST}:{port} HOST` and open the link "
        f"with :{PORT} in its place."
    )


def serve(path: Path, port: int = PORT, open_browser: bool = True, once: bool = True) -> None:
    """`fsdp-trace view FILE`: serve FILE to ui.perfetto.dev and print (and open) the link.

    once=True returns after the UI has fetched the file; otherwise it serves until Ctrl-C.
    A port other than 9001 is served (behind an ssh forward it works) with a warning."""
    with TraceServer(path, port) as server:
        warning = port_warning(server.port)
        if warning:
            print(f"fsdp-trace view: {warning}", file=sys.stderr, flush=True)
        size_mb = server.path.stat().st_size / 1e6
        print(f"Open {server.url}", flush=True)
        print(
            f"(serving {server.path.name}, {size_mb:.1f} MB, on {HOST}:{server.port}"
            f"{' until the UI has loaded it' if once else ''}; Ctrl-C to stop; on a remote "
            f"machine first run `ssh -L {server.port}:{HOST}:{server.port} HOST` locally)",
            flush=True,
        )
        if open_browser:
            open_in_browser(server.url)
        try:
            server.serve(once=once)
        except KeyboardInterrupt:
            print("stopped", flush=True)
            return
        if once:
            print(f"served {server.path.name} to the Perfetto UI", flush=True)
