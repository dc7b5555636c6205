"""Traces named by fsspec URLs (`s3://bucket/run/`, `gs://…`, `file:///shared/run`): found
with the URL's filesystem, and read where the analysis runs (a Dask worker, a pool process, or
here), one trace at a time.

fsspec is imported only when a URL is given (it comes with `fsdp-trace[dask]`; `s3://` needs
`s3fs`, `gs://` `gcsfs`, …). A remote trace is copied to a local temporary file (under
$TMPDIR, named as in the URL so its rank still shows in the name), analyzed by the ordinary
loader, and deleted: the loader's bounded, regular-file reading stays the one way a trace is
read. A `file://` URL is read in place.

Cache: a URL's analysis is keyed on what its filesystem reports about the object — the URL,
its size, and its version (ETag, generation, or modification time, whichever the backend
gives) — so an unchanged object is neither downloaded nor parsed again. A backend reporting
no version keys the entry on the downloaded copy's content instead (downloaded, not parsed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsdp_trace.errors import UserError

# `proto://…` or an fsspec chain `cache::proto://…`.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")
# What fsspec backends report about an object's version, most precise first.
_VERSION_KEYS = (
    "ETag",
    "etag",
    "md5Hash",
    "generation",
    "VersionId",
    "version_id",
    "LastModified",
    "last_modified",
    "updated",
    "mtime",
    "modified",
    "created",
)


def is_url(text: str | os.PathLike) -> bool:
    """Whether an input names an fsspec URL rather than a local path."""
    return isinstance(text, str | Url) and bool(_URL.match(str(text)))


@dataclasses.dataclass(frozen=True, order=True)
class Url:
    """A trace file or folder named by a URL, with the few path-like parts the input
    discovery and grouping use (`name`, `parent`). `size`: bytes as listed (-1 unknown)."""

    url: str
    size: int = dataclasses.field(default=-1, compare=False)

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        """The last part of the path; of a chained URL (`zip://rank0.json::/runs/x.zip`),
        the member's."""
        return self.url.split("::", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Url:
        head, sep, _ = self.url.rstrip("/").rpartition("/")
        return Url(head if sep and not head.endswith((":/", "://")) else self.url)

    def child(self, name: str) -> Url:
        return Url(self.url.rstrip("/") + "/" + name)


def _fsspec_missing(url: str) -> UserError:
    return UserError(
        f"{url}: reading a URL needs fsspec: pip install 'fsdp-trace[dask]' (and the backend "
        "of its protocol, e.g. s3fs for s3://), or give a local path"
    )


def filesystem(url: str) -> tuple[Any, str]:
    """The URL's fsspec filesystem and the path on it; a one-line error when fsspec, or the
    protocol's backend, is not installed."""
    try:
        import fsspec.core
    except ImportError:
        raise _fsspec_missing(url) from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:  # fsspec names the package: "Install s3fs to access S3"
        raise UserError(f"{url}: {_first_line(exc)}, to read this URL") from None
    except ValueError as exc:  # "Protocol not known: xyz"
        raise UserError(f"{url}: {_first_line(exc)}: give a path or an fsspec URL") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _io_error(url: str, exc: Exception, doing: str = "cannot read") -> UserError:
    """A one-line error for a failed remote call (permissions, credentials, network): the
    backends raise their own exception types, so any is turned into one line here."""
    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return UserError(f"{url}: no such file or folder")
    return UserError(f"{url}: {doing} ({type(exc).__name__}: {_first_line(exc)})")


# --- finding the traces behind a URL ---------------------------------------------------------


def find(url: str, depth: int) -> tuple[list[Url], list[Url]]:
    """Run folders (holding run.json) and loose trace files at or below `url`, as the local
    walk finds them (`fsdp_trace.analysis.read.inputs`): a folder with run.json is a run, a folder
    with traces is not searched further, and at most `depth` folders down."""
    from fsdp_trace.analysis.read import readers
    from fsdp_trace.analysis.read.readers import OWN_RECORDS
    from fsdp_trace.analysis.read.trace import rank_from_name
    from fsdp_trace.runrecord import RUN_FILE

    fs, root = filesystem(url)
    try:
        info = fs.info(root)
        if info.get("type") != "directory":
            readers.reader_for(Path(Url(url).name))  # a format some reader takes
            return [], [Url(url, int(info.get("size") or -1))]
        listing = fs.find(root, maxdepth=depth + 1, withdirs=True, detail=True)
    except Exception as exc:
        raise _io_error(url, exc, "cannot list") from None
    base = root.rstrip("/")
    folders: dict[str, list[tuple[str, dict]]] = {}
    for name, item in listing.items():
        name = name.rstrip("/")
        if name == base or not name.startswith(base + "/"):
            continue
        parent, _, leaf = name.rpartition("/")
        folders.setdefault(parent, [])
        if item.get("type") == "directory":
            folders.setdefault(name, [])
        folders[parent].append((leaf, item))

    def to_url(name: str, size: int = -1) -> Url:
        if _is_local(fs):
            return Url("file://" + name, size)
        return Url(fs.unstrip_protocol(name), size)

    def walk(folder: str, left: int) -> tuple[list[Url], list[Url]]:
        entries = sorted(folders.get(folder, []))
        if any(leaf == RUN_FILE and item.get("type") != "directory" for leaf, item in entries):
            return [to_url(folder)], []
        files = [
            to_url(f"{folder}/{leaf}", int(item.get("size") or -1))
            for leaf, item in entries
            if item.get("type") != "directory"
            and leaf.endswith(readers.suffixes())
            and leaf not in OWN_RECORDS
        ]
        if files or left == 0:
            rank = lambda u: r if (r := rank_from_name(Path(u.name))) is not None else 1 << 30  # noqa: E731
            return [], sorted(files, key=lambda u: (rank(u), u.name))
        runs: list[Url] = []
        loose: list[Url] = []
        for leaf, item in entries:
            if item.get("type") == "directory" and not leaf.startswith("."):
                r, f = walk(f"{folder}/{leaf}", left - 1)
                runs += r
                loose += f
        return runs, loose

    return walk(base, depth)


def read_run_file(folder: Url):  # -> RunRecord
    """A URL run folder's run.json, with the local reader's checks and messages."""
    from fsdp_trace.runrecord import RUN_FILE, RUN_FILE_MAX_BYTES, parse_run

    where = folder.child(RUN_FILE).url
    fs, path = filesystem(where)
    try:
        size = int(fs.info(path).get("size") or 0)
        if size > RUN_FILE_MAX_BYTES:
            raise UserError(
                f"{where}: over {RUN_FILE_MAX_BYTES >> 20} MB, not a run.json fsdp-trace wrote "
                "(those are a few KB): re-run the capture or remove the file"
            )
        text = fs.cat_file(path)
    except Exception as exc:
        raise _io_error(where, exc) from None
    return parse_run(text, where)


def listed_files(folder: Url) -> dict[str, int]:
    """Files at or below a URL folder (names relative to it, `/`-separated), and their sizes."""
    fs, path = filesystem(folder.url)
    base = path.rstrip("/") + "/"
    try:
        items = fs.find(path, detail=True)
    except Exception as exc:
        raise _io_error(folder.url, exc, "cannot list") from None
    return {
        name[len(base) :]: int(item.get("size") or -1)
        for name, item in items.items()
        if name.startswith(base) and item.get("type") != "directory"
    }


# --- reading one trace ----------------------------------------------------------------------


def fingerprint(url: str) -> str | None:
    """What the filesystem says identifies this version of the object (URL, size, version),
    hashed; None when it reports no version (then the downloaded content keys the cache)."""
    from fsdp_trace.analysis.read.cache import _checksum_hasher

    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except Exception as exc:
        raise _io_error(url, exc) from None
    version = next((info[k] for k in _VERSION_KEYS if info.get(k) not in (None, "")), None)
    if version is None:
        return None
    hasher = _checksum_hasher()
    hasher.update(json.dumps([url, info.get("size"), str(version)]).encode())
    return f"url-{hasher.hexdigest()}-{info.get('size')}"


@contextlib.contextmanager
def local_copy(url: str) -> Iterator[Path]:
    """A local file holding the object at `url`, for as long as the block runs: the file
    itself for a `file://` URL, else a download into a temporary folder, deleted after."""
    fs, path = filesystem(url)
    if _is_local(fs):
        yield Path(path)
        return
    _check_before_copy(fs, path, url)
    folder = tempfile.mkdtemp(prefix="fsdp-trace-url-")
    try:
        target = Path(folder) / (Url(url).name or "trace.json")
        try:
            fs.get_file(path, str(target))
        except Exception as exc:
            raise _io_error(url, exc) from None
        yield target
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check_before_copy(fs: Any, path: str, url: str) -> None:
    """What can be told before the object is copied here, refused before it is: an archive
    member that expands past the ratio no trace has (a zip bomb: its sizes are in the
    archive's directory), and a first byte no trace starts with."""
    from fsdp_trace.analysis.read.text import GZIP_MAX_RATIO, GZIP_RATIO_FLOOR

    try:
        info = fs.info(path)
        with fs.open(path, "rb") as handle:
            head = handle.read(64)
    except Exception as exc:
        raise _io_error(url, exc) from None
    size, packed = info.get("size"), info.get("compress_size")
    sized = isinstance(size, int) and isinstance(packed, int) and packed > 0
    if sized and size > GZIP_RATIO_FLOOR and size > GZIP_MAX_RATIO * packed:
        raise UserError(
            f"{url}: expands to over {GZIP_MAX_RATIO}x its compressed size in the archive "
            f"({size >> 20} MB from {packed >> 10} KB; Kineto traces expand 8-20x): a zip "
            "bomb? refused, not copied"
        )
    text = head.lstrip(b" \t\r\n")
    if head and not (
        head.startswith((b"\x1f\x8b", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"))
        or text[:1] in (b"{", b"[")
        or b"\x00" in head[:4]  # UTF-16/32 without a byte-order mark: the loader says so
        or not text  # blank so far: the loader reads on
    ):
        raise UserError(f"{url}: not a trace (it starts {head[:16]!r}): refused, not copied")


def as_url(text: str, local: Path, url: str) -> str:
    """`text` (an error or notice about the local copy) naming the URL instead."""
    return text.replace(str(local), url)
