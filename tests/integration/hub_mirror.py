"""A Hugging Face Hub mirror on loopback, for the pull tests: it speaks the hub's file API
(what huggingface_hub calls: `GET /api/models/REPO[/revision/REV]?blobs=true`, and `HEAD`/`GET
/REPO/resolve/REV/FILE` with ranges) for real files on disk, and is pointed at with HF_ENDPOINT
as a mirror is. Faults to test against: a connection dropped partway through a file, and a
file served with one byte changed (its listed sha256 stays the real one)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_MIN = 1024  # files this big or bigger are LFS files, as the hub stores weights


@dataclass
class Served:
    path: Path
    size: int
    sha256: str
    blob_id: str

    @property
    def lfs(self) -> bool:
        return self.size >= LFS_MIN


def _describe(path: Path) -> Served:
    sha, git = hashlib.sha256(), hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            git.update(chunk)
    return Served(path, path.stat().st_size, sha.hexdigest(), git.hexdigest())


@dataclass
class Mirror:
    repos: dict[str, dict[str, Served]] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)  # "REPO/FILE": bytes sent before the first GET's drop
    corrupt: set[str] = field(default_factory=set)  # "REPO/FILE": served with one byte changed
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range header)
    sent: dict[str, int] = field(default_factory=dict)  # "REPO/FILE": body bytes sent in all

    def add(self, repo: str, files: dict[str, Path]) -> None:
        self.repos[repo] = {name: _describe(Path(p)) for name, p in files.items()}

    def start(self) -> str:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                mirror.handle(self, head=False)

            def do_HEAD(self):
                mirror.handle(self, head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the routes

    def handle(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range", "")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            return self._info(h, m.group(1))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        if m:
            return self._file(h, m.group(1), m.group(2), head=head)
        self._send(h, 404, b'{"error": "not found"}')

    def _send(self, h, status: int, body: bytes, headers: dict | None = None) -> None:
        h.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _info(self, h, repo: str) -> None:
        files = self.repos.get(repo)
        if files is None:
            return self._send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        siblings = [{"rfilename": n, "size": s.size, "blobId": s.blob_id,
                     **({"lfs": {"sha256": s.sha256, "size": s.size, "pointerSize": 134}} if s.lfs else {})}
                    for n, s in sorted(files.items())]
        self._send(h, 200, json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                       "siblings": siblings}).encode())

    def _file(self, h, repo: str, name: str, *, head: bool) -> None:
        s = self.repos.get(repo, {}).get(name)
        if s is None:
            return self._send(h, 404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})
        etag = s.sha256 if s.lfs else s.blob_id
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))
        if rng:
            start = min(int(rng.group(1)), s.size)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(s.size - start),
                   "Accept-Ranges": "bytes", "ETag": f'"{etag}"', "X-Repo-Commit": COMMIT}
        if s.lfs:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(s.size)})
        if rng:
            headers["Content-Range"] = f"bytes {start}-{s.size - 1}/{s.size}"
        h.send_response(206 if rng else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        key = f"{repo}/{name}"
        stop = s.size
        if key in self.drop_after:
            stop = max(start, self.drop_after.pop(key))  # once: the retry gets the rest
        with open(s.path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < stop:
                chunk = f.read(min(1 << 16, stop - pos))
                if not chunk:
                    break
                if key in self.corrupt and pos <= s.size // 2 < pos + len(chunk):
                    i = s.size // 2 - pos
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                try:
                    h.wfile.write(chunk)
                except OSError:
                    return
                pos += len(chunk)
                self.sent[key] = self.sent.get(key, 0) + len(chunk)
        if stop < s.size:  # the drop: close with the body short of its Content-Length
            h.close_connection = True
            try:
                h.wfile.flush()
                h.connection.shutdown(2)
            except OSError:
                pass


def split_gguf(src: Path, out: Path, stem: str, parts: int = 2) -> list[Path]:
    """`src` as a split GGUF of `parts` files (`STEM-00001-of-0000N.gguf` …), as llama.cpp's
    gguf-split writes one: the metadata in the first, the tensors spread over all, with the
    split.* keys; written with the gguf package's writer."""
    import gguf
    reader = gguf.GGUFReader(src)
    per = -(-len(reader.tensors) // parts)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out / f"{stem}.gguf", arch, split_max_tensors=per)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        writer.add_key_value(f.name, f.contents(), vtype,
                             sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out.glob(f"{stem}-*-of-*.gguf"))
