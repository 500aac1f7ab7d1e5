"""Models by name from the Hugging Face Hub: `REPO[:QUANT|:FILE]` becomes files in
huggingface_hub's cache (its layout, `HF_TOKEN`, `HF_ENDPOINT` for a mirror, `HF_HUB_OFFLINE`),
fetched by its downloader (resume, a lock per file), and checked against the hub's hashes
(sha256 for LFS files, the git blob id for the rest) before a file is served.

A GGUF repo gives one model file, picked by quantization tag with llama-server's `-hf` rules
(the tag as `-TAG.` or `-TAG-` in the name, case-insensitive; no tag: Q4_K_M, then Q8_0, then
the first model file; never an mmproj or imatrix; a split GGUF, `-00001-of-0000N`, whole). A
repo of safetensors gives a folder, for the transformers or sentence runtime."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .pull_bounds import Bounds

log = logging.getLogger("superfluid.hub")

_NAME = re.compile(r"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
                   r"([A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?::([^:/\s]{1,200}))?$")
SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
# a folder model: its weights (safetensors only: no pickles), config, tokenizer and templates,
# and a sentence-transformers folder's modules
FOLDER_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "1_Pooling/*",
                   "2_Dense/*", "2_Normalize/*", "3_Dense/*")


class HubUnreachable(ModelLoadError):
    """The hub (or the HF_ENDPOINT mirror) did not answer."""


@dataclass(frozen=True)
class HubName:
    """A model named as the user gave it: REPO, REPO:QUANT or REPO:FILE.gguf."""
    repo: str
    tag: str = ""
    file: str = ""

    def __str__(self) -> str:
        suffix = self.file or self.tag
        return f"{self.repo}:{suffix}" if suffix else self.repo


def parse(text: str) -> HubName | None:
    """The hub name in `text`, or None when it reads as a path (it starts with /, . or ~,
    or ends with .gguf without a repo's colon)."""
    if not text or text[0] in "/.~" or (text.lower().endswith(".gguf") and ":" not in text):
        return None
    m = _NAME.match(text)
    if m is None or ".." in m.group(1):
        return None
    repo, suffix = m.group(1), m.group(2) or ""
    if suffix.lower().endswith(".gguf"):
        return HubName(repo, file=suffix)
    return HubName(repo, tag=suffix)


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (`superfluid --offline` sets it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def is_model_gguf(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(w in name for w in NOT_MODELS)


def split_parts(path: str, files: list[str]) -> list[str]:
    """All parts of the split GGUF `path` is the first of, in order (itself alone when whole)."""
    m = SPLIT.match(path)
    if m is None:
        return [path]
    count = int(m.group(3))
    want = {f"{m.group(1)}-{i:05d}-of-{m.group(3)}.gguf".lower(): i for i in range(1, count + 1)}
    have = sorted((want[f.lower()], f) for f in files if f.lower() in want)
    if len(have) != count:
        raise ModelLoadError(f"{path} is part 1 of {count}, but the repo has {len(have)} of its parts")
    return [f for _, f in have]


def pick_gguf(files: list[str], *, tag: str = "", file: str = "") -> list[str]:
    """The model files a GGUF repo's name picks: a file named exactly, else the first model
    file whose name holds the tag (`-Q4_K_M.` …), else (no tag) Q4_K_M, then Q8_0, then the
    first model file; with all its split parts. [] when nothing matches."""
    if file:
        hit = [f for f in files if f.lower() == file.lower()]
        return split_parts(hit[0], files) if hit else []
    models = [f for f in sorted(files) if is_model_gguf(f)]
    firsts = [f for f in models if (m := SPLIT.match(f)) is None or int(m.group(2)) == 1]
    for t in ([tag] if tag else list(DEFAULT_TAGS)):
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for f in firsts:
            if pattern.search(f.rsplit("/", 1)[-1]):
                return split_parts(f, files)
    if not tag and firsts:
        return split_parts(firsts[0], files)
    return []


def is_folder_repo(files: list[str]) -> bool:
    return "config.json" in files and any(f.endswith(".safetensors") for f in files)


def folder_files(files: list[str]) -> list[str]:
    from fnmatch import fnmatch
    return [f for f in files if any(fnmatch(f, p) for p in FOLDER_PATTERNS)]


@dataclass(frozen=True)
class Pulled:
    """A pulled model: the path to serve (the GGUF's first part, or the snapshot folder)."""
    path: str
    files: tuple[str, ...]
    bytes: int


Report = Callable[[str, int, int], None]  # (file, bytes done, bytes in all): a pull's progress


def pull(name: HubName, *, progress: bool | None = None, report: Report | None = None,
         bounds: Bounds | None = None) -> Pulled:
    """The model `name` names, in the cache: downloaded and checked first unless it is there
    (or HF_HUB_OFFLINE is set, when only what is cached is served). `progress`: a bar (None:
    when stderr is a terminal); `report` is called as each file's bytes arrive; `bounds` (a
    pull the daemon runs): its size and the disk's room, checked before and during."""
    try:
        import huggingface_hub as hf  # noqa: F401
    except ImportError:
        raise ModelLoadError(f"{name} is a Hugging Face name, and pulling needs huggingface_hub: "
                             "pip install huggingface_hub") from None
    if offline():
        return _cached(name)
    try:
        listing = _listing(name)
    except HubUnreachable as e:
        try:  # the hub is unreachable: a copy in the cache still serves, as llama-server's -hf does
            pulled = _cached(name)
        except ModelLoadError:
            raise e from None
        log.warning("%s; serving the copy in the cache", e.message.split("; --offline")[0])
        return pulled
    files = _choose(name, list(listing))
    if bounds is not None:
        import huggingface_hub as hf
        new = [f for f in files if not (isinstance(c := hf.try_to_load_from_cache(name.repo, f), str)
                                        and _trusted(c, listing[f]))]
        bounds.before(name, sum(listing[f].size or 0 for f in files), sum(listing[f].size or 0 for f in new),
                      _cache_dir())
    t0 = time.monotonic()
    paths = [_fetch(name, f, listing[f], progress, report, bounds) for f in files]
    total = sum(os.path.getsize(p) for p in paths)
    log.info("%s: %d file%s, %.1f MB, ready in %.1f s", name, len(paths), "s" * (len(paths) > 1), total / 1e6,
             time.monotonic() - t0)
    return Pulled(_served_path(files, paths), tuple(paths), total)


def _served_path(files: list[str], paths: list[str]) -> str:
    if files[0].lower().endswith(".gguf"):
        return paths[0]
    # a folder: the snapshot's root (files may sit in subfolders of it)
    depth = files[0].count("/") + 1
    return str(Path(paths[0]).parents[depth - 1])


def _choose(name: HubName, files: list[str]) -> list[str]:
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if name.file or any(is_model_gguf(f) for f in files):  # a repo with both: the GGUF (llama.cpp)
        picked = pick_gguf(files, tag=name.tag, file=name.file)
        if not picked:
            listed = ", ".join(f for f in ggufs if is_model_gguf(f))[:2000] or "none"
            what = f"no file {name.file}" if name.file else f"no GGUF tagged {name.tag or ' or '.join(DEFAULT_TAGS)}"
            raise ModelLoadError(f"{name.repo} has {what}; its GGUF files: {listed}")
        return picked
    if is_folder_repo(files):
        if name.tag:
            raise ModelLoadError(f"{name.repo} is a safetensors repo: it has no quantization tags ({name.tag})")
        return folder_files(files)
    raise ModelLoadError(f"{name.repo} has neither a GGUF file nor safetensors weights with a config.json")


def _listing(name: HubName) -> dict[str, Any]:
    """The repo's files, with their sizes and hashes (model_info with files_metadata)."""
    import huggingface_hub as hf
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    try:
        info = hf.HfApi().model_info(name.repo, files_metadata=True)
    except GatedRepoError:
        raise ModelLoadError(f"{name.repo} is gated: accept its terms on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{name.repo} is not on {_endpoint()} (or it is private: set HF_TOKEN)") from None
    except HfHubHTTPError as e:
        raise ModelLoadError(f"{name.repo}: the hub answered {_status(e)}") from None
    except _network_errors() as e:
        raise HubUnreachable(f"{name.repo}: cannot reach {_endpoint()} ({e}); --offline serves what is "
                             "cached") from None
    return {s.rfilename: s for s in (info.siblings or [])}


def _network_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub's HTTP client raises when the network fails: httpx's transport
    errors (httpx2 from huggingface_hub 2), and OSError."""
    out: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            out.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(out)


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


def _status(e: Exception) -> str:
    r = getattr(e, "response", None)
    return f"HTTP {r.status_code}" if r is not None else str(e)[:200]


def _fetch(name: HubName, filename: str, sibling: Any, progress: bool | None, report: Report | None,
           bounds: Bounds | None = None) -> str:
    """One file into the cache, through huggingface_hub's downloader, checked before use."""
    import huggingface_hub as hf
    from huggingface_hub.errors import HfHubHTTPError
    cached = hf.try_to_load_from_cache(name.repo, filename)
    if isinstance(cached, str) and _trusted(cached, sibling):
        if report is not None:
            report(filename, sibling.size or 0, sibling.size or 0)
        return cached
    bar = (sys.stderr.isatty() if progress is None else progress) and report is None and bounds is None
    check = bounds.watch(name, filename, sibling.size or 0, _cache_dir()) if bounds is not None else None
    tqdm_class = None if bar else partial(LogProgress, filename=filename, report=report, check=check)
    try:
        path = hf.hf_hub_download(name.repo, filename, tqdm_class=tqdm_class)  # type: ignore[arg-type]
    except ModelLoadError:  # stopped by the bounds: the partial file goes (it is what filled the disk)
        lfs = getattr(sibling, "lfs", None)
        etag = lfs.sha256 if lfs is not None else getattr(sibling, "blob_id", None)
        if etag:
            blobs = Path(_cache_dir()) / f"models--{name.repo.replace('/', '--')}" / "blobs"
            (blobs / f"{etag}.incomplete").unlink(missing_ok=True)
        raise
    except HfHubHTTPError as e:
        raise ModelLoadError(f"{name.repo}/{filename}: the hub answered {_status(e)}") from None
    except _network_errors() as e:
        raise ModelLoadError(f"{name.repo}/{filename}: the download failed ({e}); pull again to resume it") from None
    _check(name, filename, path, sibling)
    return path


def _trusted(path: str, sibling: Any) -> bool:
    """A cached file checked when it was pulled: huggingface_hub names an LFS blob by its
    sha256, so the blob's name and size must be the hub's."""
    lfs = getattr(sibling, "lfs", None)
    try:
        blob = Path(path).resolve()
        size = blob.stat().st_size
    except OSError:
        return False
    if lfs is not None:
        return blob.name == lfs.sha256 and size == lfs.size
    return sibling.size is None or size == sibling.size


def _check(name: HubName, filename: str, path: str, sibling: Any) -> None:
    """The file's hash against the hub's: sha256 of an LFS file, the git blob id of another.
    A mismatch removes the file (blob and link) and is an error."""
    lfs = getattr(sibling, "lfs", None)
    want = lfs.sha256 if lfs is not None else getattr(sibling, "blob_id", None)
    if not want:
        return
    got = file_sha256(path) if lfs is not None else git_blob_id(path)
    if got == want:
        return
    blob = Path(path).resolve()
    for p in (Path(path), blob):
        try:
            p.unlink()
        except OSError:
            pass
    kind = "sha256" if lfs is not None else "git blob id"
    raise ModelLoadError(f"{name.repo}/{filename} failed its {kind} check: the hub says {want}, the download is "
                         f"{got}; the file was removed, pull again")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def git_blob_id(path: str) -> str:
    size = os.path.getsize(path)
    h = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cached(name: HubName) -> Pulled:
    """Offline: the model from the cache alone, picked by the same rules."""
    import huggingface_hub as hf
    from huggingface_hub.errors import LocalEntryNotFoundError
    try:
        root = Path(hf.snapshot_download(name.repo, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise ModelLoadError(f"{name} is not in the cache ({_cache_dir()}), and HF_HUB_OFFLINE is set: "
                             f"pull it first (superfluid pull {name})") from None
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    try:
        chosen = _choose(name, files)
    except ModelLoadError as e:
        raise ModelLoadError(f"{e.message} (in the cache; HF_HUB_OFFLINE is set)") from None
    paths = [str(root / f) for f in chosen]
    return Pulled(_served_path(chosen, paths), tuple(paths), sum(os.path.getsize(p) for p in paths))


def _cache_dir() -> str:
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


class LogProgress:
    """huggingface_hub's progress bar when stderr is not a terminal: a log line when a file
    starts, every 10% and at its end (a daemon's log, CI)."""

    QUIET_BELOW = 1 << 20  # files smaller than this (configs, tokenizers) are pulled without a line

    def __init__(self, *, filename: str = "", total: int | None = None, initial: int = 0,
                 report: Report | None = None, check: Callable[[int], None] | None = None, **_: Any):
        self.filename, self.total, self.n, self.report, self.check = filename, total, initial, report, check
        self._reported = -1
        self._step = (initial * 10 // total + 1) if total else 1
        self._t0 = time.monotonic()
        self.quiet = total is not None and total < self.QUIET_BELOW
        if not self.quiet:
            size = f"{total / 1e6:.1f} MB" if total else "size unknown"
            log.info("pulling %s (%s%s)", filename, size, f", resuming at {initial / 1e6:.1f} MB" if initial else "")

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.check is not None:
            self.check(self.n)  # raises to stop the download (runtime/pull_bounds.py)
        if self.report is not None and self.total:
            pct = self.n * 100 // self.total
            if pct != self._reported:  # at most a report per percent
                self._reported = pct
                self.report(self.filename, self.n, self.total)
        if (self.total and not self.quiet and self.n * 10 // self.total >= self._step and self.n < self.total):
            self._step = self.n * 10 // self.total + 1
            log.info("pulling %s: %d%% of %.1f MB", self.filename, self.n * 100 // self.total, self.total / 1e6)

    def close(self) -> None:
        if self.total and self.n >= self.total and not self.quiet:
            log.info("pulled %s: %.1f MB in %.1f s", self.filename, self.n / 1e6, time.monotonic() - self._t0)

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
