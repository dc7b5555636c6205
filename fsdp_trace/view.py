"""`fsdp-trace view FILE`: open a trace in ui.perfetto.dev, served from this machine.

The UI fetches `?url=` traces from the browser, and its content security policy lets it reach
only `http://127.0.0.1:9001` (the port of trace_processor's RPC server) among local addresses,
so the file is served there, with CORS for the UI's origin. At start-up the UI probes
`POST /status` on that port for a trace_processor; the probe gets a 404, which sends it on to
the `?url=` load. Nothing but the one file is served. On a remote machine, forward the port
(`ssh -L 9001:127.0.0.1:9001 HOST`) and open the printed link locally.

Hardening: each client gets its own thread and a socket timeout (a client that sends or reads
nothing is dropped, and never holds up the others); a request whose `Host` is not 127.0.0.1 or
localhost gets 403 (a page whose own name was rebound to 127.0.0.1 cannot read the trace: DNS
rebinding); the file is opened once at start and that open file is what is served, with its
size then, whatever happens to the path afterwards (replaced, deleted). A file cut short in
place ends the response short of its Content-Length: the client sees a broken download, never
a different file.
"""

from __future__ import annotations

import errno
import http.server
import os
import socketserver
import stat
import sys
import threading
import webbrowser
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from fsdp_trace.errors import UserError
from fsdp_trace.printable import printable

UI_ORIGIN = "https://ui.perfetto.dev"
HOST = "127.0.0.1"
PORT = 9001  # the only local port the UI's CSP (connect-src) lets ?url= reach
# Seconds a client may stay silent (sending its request, or reading the file) before it is
# dropped; each client has its own thread, so a slow one only ever delays itself.
CLIENT_TIMEOUT_S = 60.0
# The names this machine is reached by in a Host header (any port: `ssh -L` may map one).
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
CHUNK = 1 << 20


def ui_url(filename: str, port: int = PORT) -> str:
    """The ui.perfetto.dev link that loads `filename` from this machine's server."""
    return f"{UI_ORIGIN}/#!/?url=http://{HOST}:{port}/{quote(filename)}"


def host_is_local(host: str | None) -> bool:
    """Whether a Host header names this machine: 127.0.0.1 or localhost, any port."""
    if not host:
        return False
    name, colon, port = host.strip().lower().partition(":")
    if colon and not (port.isdigit() and len(port) <= 5):
        return False
    return name in LOCAL_HOSTS


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /<file name> → the file; anything else (POST /status included) → 404; a Host that is
    not this machine → 403."""

    server: _HttpServer
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers

    def setup(self) -> None:
        self.timeout = self.server.client_timeout  # StreamRequestHandler sets it on the socket
        super().setup()

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

    def _refused(self) -> bool:
        """403 for a request not addressed to 127.0.0.1/localhost (DNS rebinding)."""
        if host_is_local(self.headers.get("Host")):
            return False
        self._headers(403, 0)
        return True

    def _is_file(self) -> bool:
        return unquote(urlsplit(self.path).path) == "/" + self.server.name

    def _send_file(self, body: bool) -> None:
        if not self.server.use_file():  # the server is stopping
            self._headers(503, 0)
            return
        try:
            size = self.server.size
            self._headers(200, size)
            if not body:
                return
            sent = 0
            try:
                while sent < size:
                    chunk = self.server.read_at(sent, min(CHUNK, size - sent))
                    if not chunk:  # cut short in place: end short of Content-Length
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
                self.wfile.flush()
            except OSError:  # the browser gave up, or stopped reading past the timeout
                return
            if sent == size:
                self.server.count_served(self.headers.get("Origin"), self.headers.get("User-Agent"))
        finally:
            self.server.done_with_file()

    def _answer(self, body: bool) -> None:
        if self._refused():
            return
        if self._is_file():
            self._send_file(body)
        else:
            self._not_found()

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_POST(self) -> None:  # the UI's trace_processor probe (POST /status)
        if not self._refused():
            self._not_found()

    do_PUT = do_DELETE = do_OPTIONS = do_PATCH = do_POST

    def log_message(self, format: str, *args) -> None:  # quiet: the CLI prints what matters
        pass


class _HttpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """One thread per client (daemon threads: a stuck client never delays exit), serving the
    one file opened at start."""

    daemon_threads = True
    # SO_REUSEADDR: rebinding right after a previous run works; a live listener still clashes.
    # (On Windows the option would let two servers share the port, so it stays off there.)
    allow_reuse_address = os.name != "nt"
    timeout = 0.2  # handle_request() returns this often, to see whether the file was served

    def __init__(self, name: str, fd: int, size: int, port: int, client_timeout: float) -> None:
        self.name = name
        self.fd = fd
        self.size = size
        self.client_timeout = client_timeout
        self.served = 0
        self.served_once = threading.Event()
        self.last_client: tuple[str | None, str | None] = (None, None)  # Origin, User-Agent
        self._lock = threading.Lock()
        self._readers = 0  # handlers reading the file now
        self._closing = False  # close the file when the last reader is done
        super().__init__((HOST, port), _Handler)

    def read_at(self, offset: int, length: int) -> bytes:
        """`length` bytes of the opened file at `offset` (threads share the descriptor)."""
        if hasattr(os, "pread"):
            return os.pread(self.fd, length, offset)
        with self._lock:  # pragma: no cover - Windows
            os.lseek(self.fd, offset, os.SEEK_SET)
            return os.read(self.fd, length)

    def use_file(self) -> bool:
        """Register a reader of the file; False once the server is closing it."""
        with self._lock:
            if self._closing:
                return False
            self._readers += 1
            return True

    def done_with_file(self) -> None:
        with self._lock:
            self._readers -= 1
            if self._closing and self._readers == 0:
                os.close(self.fd)

    def close_file(self) -> None:
        """Close the file now, or when the last reader is done (a stuck client's thread may
        outlive the server): never while a thread may still read from the descriptor."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._readers == 0:
                os.close(self.fd)

    def count_served(self, origin: str | None = None, agent: str | None = None) -> None:
        with self._lock:
            self.served += 1
            self.last_client = (origin, agent)
        self.served_once.set()

    def handle_error(self, request, client_address) -> None:
        """A client that vanished or timed out is not an error worth a traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _open_trace(path: Path) -> tuple[int, int]:
    """The file's descriptor and size, opened once: a regular file, or a UserError."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if not path.is_file():
        raise UserError(f"{path}: not a file")
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UserError(f"{path}: cannot open ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # swapped for a FIFO or device since the check
        os.close(fd)
        raise UserError(f"{path}: not a file")
    return fd, info.st_size


class TraceServer:
    """Serves one trace file on 127.0.0.1:`port` for ui.perfetto.dev.

    The file is opened here, and that open file (its size and bytes) is what is served.
    Binding happens here too: a port in use raises UserError. `serve(once=True)` answers
    requests until the file has been sent once; `start()` / `stop()` run it in a thread
    (tests). `client_timeout`: seconds a client may stay silent before it is dropped."""

    def __init__(
        self, path: str | Path, port: int = PORT, client_timeout: float = CLIENT_TIMEOUT_S
    ) -> None:
        if not 0 <= port <= 65535:
            raise UserError(
                f"--port {port}: not a TCP port; give one from 1 to 65535 (ui.perfetto.dev "
                f"loads traces from {PORT} only)"
            )
        path = Path(path)
        fd, size = _open_trace(path)
        self.path = path.resolve()
        try:
            self._server = _HttpServer(self.path.name, fd, size, port, client_timeout)
        except OSError as exc:
            os.close(fd)
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
    def size(self) -> int:
        """The size of the file as opened at start: what every response carries."""
        return self._server.size

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

    def what_happened(self) -> str:
        """The last full download, in words: to the Perfetto UI (the request came from its
        page: `Origin`), or to another client, named by its headers."""
        origin, agent = self._server.last_client
        sent = f"sent {self.path.name} ({self.size / 1e6:.1f} MB) in full"
        if origin == UI_ORIGIN:
            return printable(f"{sent} to the Perfetto UI (a {UI_ORIGIN} page): it shows it there")
        return printable(
            f"{sent} to a client that is not the Perfetto UI (Origin: {origin or 'none'}; "
            f"User-Agent: {agent or 'none'}): the UI has not loaded it; open the link above "
            "in a browser (run again, or --keep-serving to serve more than one download)"
        )

    def serve(self, once: bool = True) -> None:
        """Answer requests: until the file has been sent once, or until interrupted."""
        if once:
            while not self._server.served_once.is_set():
                self._server.handle_request()
        else:
            self._server.serve_forever()

    def start(self) -> TraceServer:
        """Serve in a daemon thread until `stop()`."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # `stop()` waits for one poll: not 0.5 s
            name="fsdp-trace-view",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_file()

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
        size_mb = server.size / 1e6
        print(f"Open {server.url}", flush=True)
        print(
            f"(serving {printable(server.path.name)}, {size_mb:.1f} MB, on {HOST}:{server.port}"
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
            print(server.what_happened(), flush=True)
