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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fsdp_trace.errors import UserError

if TYPE_CHECKING:
    from fsdp_trace.runrecord import RunRecord

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


def io_error(url: str, exc: Exception, doing: str = "cannot read") -> UserError:
    """A one-line error for a failed remote call (permissions, credentials, network): the
    backends raise their own exception types, so any is turned into one line here."""
    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return UserError(f"{url}: no such file or folder")
    return UserError(f"{url}: {doing} ({type(exc).__name__}: {_first_line(exc)})")


# --- a folder behind a URL ------------------------------------------------------------------


class _Entry(NamedTuple):
    """One object of a listing: its last name part, and its size in bytes (-1 unknown)."""

    name: str
    is_folder: bool
    size: int


def _entry(name: str, item: dict[str, Any]) -> _Entry:
    return _Entry(name, item.get("type") == "directory", int(item.get("size") or -1))


def open_url(url: str, depth: int) -> Url | UrlFolder:
    """What a URL names: a trace file (of a format some reader takes), or a folder, listed
    once down to `depth` folders below it (and the files in the deepest): what the walk in
    `fsdp_trace.analysis.read.inputs` reads, one object per call for a whole tree."""
    from fsdp_trace.analysis.read import readers

    fs, root = filesystem(url)
    try:
        info = fs.info(root)
        if info.get("type") != "directory":
            readers.reader_for(Path(Url(url).name))  # a format some reader takes
            return Url(url, int(info.get("size") or -1))
        listing = fs.find(root, maxdepth=depth + 1, withdirs=True, detail=True)
    except Exception as exc:
        raise io_error(url, exc, "cannot list") from None
    base = root.rstrip("/")
    tree: dict[str, list[_Entry]] = {}
    for name, item in listing.items():
        name = name.rstrip("/")
        if name == base or not name.startswith(base + "/"):
            continue
        parent, _, leaf = name.rpartition("/")
        entry = _entry(leaf, item)
        tree.setdefault(parent, []).append(entry)
        if entry.is_folder:
            tree.setdefault(name, [])
    return UrlFolder(fs, base, tree)


class UrlFolder:
    """A folder behind a URL, as `fsdp_trace.analysis.read.inputs.Folder` (the walk and the
    run reader read local and URL folders alike): listed from `open_url`'s one listing, and
    a run folder's own files listed once more, all the way down, when its run is read."""

    def __init__(self, fs: Any, path: str, tree: dict[str, list[_Entry]]) -> None:
        self._fs, self._path, self._tree = fs, path, tree
        self._listed: dict[str, int] | None = None  # a run folder's files -> sizes
        self.where = self._url(path)

    def _url(self, name: str, size: int = -1) -> Url:
        if _is_local(self._fs):
            return Url("file://" + name, size)
        return Url(self._fs.unstrip_protocol(name), size)

    def key(self) -> str:
        return self.where.url

    def same_as(self, other: Path | Url) -> bool:
        return False  # one name per object: equal URLs are the same folder

    def holds_run(self) -> bool:
        from fsdp_trace.runrecord import RUN_FILE

        return any(e.name == RUN_FILE and not e.is_folder for e in self._tree.get(self._path, []))

    def entries(self) -> tuple[list[tuple[str, Url]], list[tuple[str, UrlFolder]]]:
        files: list[tuple[str, Url]] = []
        folders: list[tuple[str, UrlFolder]] = []
        for e in self._tree.get(self._path, []):
            path = f"{self._path}/{e.name}"
            if e.is_folder:
                folders.append((e.name, UrlFolder(self._fs, path, self._tree)))
            else:
                files.append((e.name, self._url(path, e.size)))
        return files, folders

    def read_run(self) -> RunRecord:
        """Its run.json, with the local reader's checks and messages."""
        from fsdp_trace.runrecord import RUN_FILE, RUN_FILE_MAX_BYTES, parse_run

        where = self.named(RUN_FILE)
        fs, path = self._fs, f"{self._path}/{RUN_FILE}"  # the filesystem it was listed with
        try:
            size = int(fs.info(path).get("size") or 0)
            if size > RUN_FILE_MAX_BYTES:
                raise UserError(
                    f"{where}: over {RUN_FILE_MAX_BYTES >> 20} MB, not a run.json fsdp-trace "
                    "wrote (those are a few KB): re-run the capture or remove the file"
                )
            text = fs.cat_file(path)
        except Exception as exc:
            raise io_error(where, exc) from None
        return parse_run(text, where)

    def leads_out(self, name: str) -> bool:
        """Whether a run.json's trace name leaves this folder: object stores take `..` as a
        name, so any `..`, a rooted name or a URL is refused."""
        return name.startswith("/") or ".." in name.split("/") or is_url(name)

    def named(self, name: str) -> str:
        return self.where.child(name).url

    def _files(self) -> dict[str, int]:
        """Its files at any depth (names relative to it, `/`-separated) and their sizes,
        listed once, with the filesystem it was listed with."""
        if self._listed is None:
            base = self._path.rstrip("/") + "/"
            try:
                items = self._fs.find(self._path, detail=True)
            except Exception as exc:
                raise io_error(self.where.url, exc, "cannot list") from None
            self._listed = {}
            for name, item in items.items():
                entry = _entry(name[len(base) :], item)
                if name.startswith(base) and not entry.is_folder:
                    self._listed[entry.name] = entry.size
        return self._listed

    def members(self) -> Callable[[str], Url | None]:
        listed = self._files()
        return lambda name: Url(self.named(name), listed[name]) if name in listed else None

    def kept(self) -> list[str]:
        return list(self._files())


# --- reading one trace ----------------------------------------------------------------------


def fingerprint(url: str) -> str | None:
    """What the filesystem says identifies this version of the object (URL, size, version),
    hashed; None when it reports no version (then the downloaded content keys the cache)."""
    from fsdp_trace.analysis.read.cache import checksum_hasher

    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except Exception as exc:
        raise io_error(url, exc) from None
    version = next((info[k] for k in _VERSION_KEYS if info.get(k) not in (None, "")), None)
    if version is None:
        return None
    hasher = checksum_hasher()
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
            raise io_error(url, exc) from None
        yield target
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check_before_copy(fs: Any, path: str, url: str) -> None:
    """What can be told before the object is copied here, refused before it is: an archive
    member that expands past the ratio no trace has (a zip bomb: its sizes are in the
    archive's directory), and a first byte no trace starts with."""
    from fsdp_trace.analysis.read.text import GZIP_MAX_RATIO, gzip_text_limit

    try:
        info = fs.info(path)
        with fs.open(path, "rb") as handle:
            head = handle.read(64)
    except Exception as exc:
        raise io_error(url, exc) from None
    size, packed = info.get("size"), info.get("compress_size")
    sized = isinstance(size, int) and isinstance(packed, int) and packed > 0
    if sized and size > gzip_text_limit(packed):
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
