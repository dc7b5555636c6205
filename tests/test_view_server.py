"""The server behind `fsdp-trace view` under load and attack: a slow client must not hold up
the others (a thread per client, a socket timeout), a request whose Host is not this machine
is refused (DNS rebinding), and what is served is the file as opened at start, whatever
happens to the path afterwards."""

from __future__ import annotations

import http.client
import os
import socket
import time
from pathlib import Path

import pytest

from fsdp_trace.view import UI_ORIGIN, TraceServer
from tests.conftest import free_port


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "my run.pftrace"
    path.write_bytes(bytes(range(256)) * 4099)
    return path


def get(server: TraceServer, path: str | None = None, host: str | None = None, method="GET"):
    """(status, headers, body) of one request; `host` replaces the Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        target = path if path is not None else "/" + server.file_url.rsplit("/", 1)[1]
        conn.putrequest(method, target, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.putheader("Origin", UI_ORIGIN)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def wait_served(server: TraceServer, count: int) -> None:
    deadline = time.monotonic() + 10
    while server.served < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.served == count


def test_a_slow_client_does_not_block_the_next_one(trace_file):
    """A client that connects and sends half a request line, then nothing: the UI's own
    request is still answered at once (today it waits until the slow one gives up)."""
    with TraceServer(trace_file, free_port()).start() as server:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            slow.sendall(b"GET /my")  # and no more
            time.sleep(0.2)  # the server has accepted it and is reading its request
            start = time.monotonic()
            status, _, body = get(server)
            assert status == 200 and body == trace_file.read_bytes()
            assert time.monotonic() - start < 5
            wait_served(server, 1)
        finally:
            slow.close()


def test_a_silent_client_is_dropped_after_the_socket_timeout(trace_file):
    with TraceServer(trace_file, free_port(), client_timeout=1).start() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            slow.sendall(b"GET /my")
            start = time.monotonic()
            assert slow.recv(1024) == b""  # the server closed it
            assert 0.5 < time.monotonic() - start < 5
        assert get(server)[0] == 200


def test_a_client_that_stops_reading_is_dropped_without_a_traceback(tmp_path, capsys):
    """A client that asks for a large file and reads none of it: the send times out, others are
    served meanwhile, nothing is printed, and the stuck download does not count as served."""
    big = tmp_path / "big.pftrace"
    big.write_bytes(os.urandom(1 << 20) * 48)
    with TraceServer(big, free_port(), client_timeout=1).start() as server:
        with socket.socket() as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.settimeout(10)
            stuck.connect(("127.0.0.1", server.port))
            stuck.sendall(b"GET /big.pftrace HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            time.sleep(0.3)
            status, _, body = get(server)
            assert status == 200 and len(body) == 48 << 20
            time.sleep(2.5)  # past the timeout: the server gives up on the stuck one
        wait_served(server, 1)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Exception" not in captured.err


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:9001",
        "127.0.0.1.evil.example.com:9001",
        "localhost.evil.example.com",
        "10.0.0.5:9001",
        "0.0.0.0:9001",
        "",
    ],
)
def test_a_foreign_host_header_is_refused(trace_file, host):
    """DNS rebinding: a page on evil.example.com whose name now resolves to 127.0.0.1 sends
    `Host: evil.example.com`; only 127.0.0.1 and localhost (any port, for ssh -L) are served."""
    with TraceServer(trace_file, free_port()).start() as server:
        for method in ("GET", "HEAD", "POST"):
            status, _, body = get(server, host=host, method=method)
            assert status == 403, (method, host)
            assert body == b""
        assert server.served == 0


def test_a_request_without_host_is_refused(trace_file):
    with TraceServer(trace_file, free_port()).start() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            client.sendall(b"GET /my%20run.pftrace HTTP/1.0\r\n\r\n")
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 403 ")
        assert server.served == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:9001", "localhost:9001", "LocalHost"])
def test_this_machines_names_are_served(trace_file, host):
    with TraceServer(trace_file, free_port()).start() as server:
        status, _, body = get(server, host=host)
        assert status == 200 and body == trace_file.read_bytes()


def test_the_file_as_opened_at_start_is_served_after_a_replace_or_delete(trace_file, tmp_path):
    original = trace_file.read_bytes()
    with TraceServer(trace_file, free_port()).start() as server:
        assert server.size == len(original)
        replacement = tmp_path / "new.pftrace"
        replacement.write_bytes(b"a newer, shorter trace")
        os.replace(replacement, trace_file)  # how writers replace a file: rename over it
        status, headers, body = get(server)
        assert status == 200 and body == original
        assert int(headers["Content-Length"]) == len(original)
        status, headers, _ = get(server, method="HEAD")
        assert status == 200 and int(headers["Content-Length"]) == len(original)
        trace_file.unlink()
        status, _, body = get(server)
        assert status == 200 and body == original
        wait_served(server, 2)


def test_a_file_truncated_in_place_is_cut_off_never_passed_off_as_whole(trace_file):
    """Rewritten in place (not replaced): the bytes are gone, so the response ends short of its
    Content-Length and the client sees an incomplete download, not a different file."""
    with TraceServer(trace_file, free_port()).start() as server:
        with open(trace_file, "r+b") as handle:
            handle.truncate(1000)
        with pytest.raises(http.client.IncompleteRead):
            get(server)
        assert server.served == 0


def _plain_get(port: int, name: str) -> int:
    """A download by a client that is not the UI (no Origin header, like curl)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/" + name)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_view_says_who_fetched_the_file(tmp_path):
    """issue 21 (8): `view` said "served FILE to the Perfetto UI" to any client that fetched
    it; it says what happened: sent to the UI's page, or to another client, named."""
    import subprocess
    import sys

    from tests.conftest import REPO

    path = tmp_path / "view.pftrace"
    path.write_bytes(b"x" * 1000)
    with TraceServer(path, port=0).start() as server:
        get(server)
        wait_served(server, 1)
        assert server.what_happened().startswith("sent view.pftrace (0.0 MB) in full to the")
        assert "to the Perfetto UI (a https://ui.perfetto.dev page)" in server.what_happened()
        assert _plain_get(server.port, "view.pftrace") == 200
        wait_served(server, 2)
        said = server.what_happened()
        assert "to a client that is not the Perfetto UI (Origin: none" in said
    port = free_port()
    args = ["view", str(path), "--no-browser", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsdp_trace", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("Open https://ui.perfetto.dev/")
        assert _plain_get(port, "view.pftrace") == 200
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("sent view.pftrace (0.0 MB) in full to a client ")
    assert "not the Perfetto UI" in out.splitlines()[-1]


@pytest.mark.parametrize("port", ["65536", "-1", "99999999999999999999"])
def test_view_port_out_of_range_is_one_line(tmp_path, port):
    """issue 21 (9): `view --port 65536` or `-1` gave OverflowError."""
    from tests.conftest import run_cli

    path = tmp_path / "view.pftrace"
    path.write_bytes(b"x")
    done = run_cli("view", str(path), "--no-browser", "--port", port)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fsdp-trace view: error: --port {port}: not a TCP port"), line
