"""What `superfluid pull` left in huggingface_hub's cache: `superfluid models` lists it, with
sizes, and `superfluid rm` deletes a model from it (runtime/hub.py pulls)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from .hub import SPLIT, HubName, is_model_gguf, pick_gguf, split_parts
from ..errors import ModelLoadError


@dataclass(frozen=True)
class CachedModel:
    name: str
    bytes: int
    files: int
    path: str


def cached_models() -> list[CachedModel]:
    """What the cache holds: a row per GGUF model (REPO:FILE) and per safetensors repo."""
    import huggingface_hub as hf
    try:
        info = hf.scan_cache_dir()
    except hf.CacheNotFound:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        files = {str(f.file_path.relative_to(rev.snapshot_path)): f for rev in repo.revisions for f in rev.files}
        names = list(files)
        ggufs = [f for f in names if is_model_gguf(f) and ((m := SPLIT.match(f)) is None or int(m.group(2)) == 1)]
        for g in ggufs:
            try:
                parts = split_parts(g, names)
            except ModelLoadError:
                continue
            out.append(CachedModel(f"{repo.repo_id}:{g}", sum(files[p].size_on_disk for p in parts), len(parts),
                                   str(files[g].file_path)))
        if not ggufs and names:  # (a repo whose only file failed its check holds none)
            out.append(CachedModel(repo.repo_id, repo.size_on_disk, repo.nb_files, str(repo.repo_path)))
    return out


def remove(name: HubName) -> list[str]:
    """Delete a pulled model from the cache: the whole repo for REPO, only the picked GGUF
    (all its parts) for REPO:QUANT or REPO:FILE. The files removed, [] when none were cached."""
    import huggingface_hub as hf
    try:
        info = hf.scan_cache_dir()
    except hf.CacheNotFound:
        return []
    repos = [r for r in info.repos if r.repo_type == "model" and r.repo_id.lower() == name.repo.lower()]
    if not repos:
        return []
    repo = repos[0]
    if not (name.tag or name.file):
        removed = [str(f.file_path) for rev in repo.revisions for f in rev.files]
        shutil.rmtree(repo.repo_path, ignore_errors=True)  # the repo's folder: blobs, snapshots, refs
        return removed
    removed = []
    for rev in repo.revisions:
        files = {str(f.file_path.relative_to(rev.snapshot_path)): f for f in rev.files}
        for rel in pick_gguf(list(files), tag=name.tag, file=name.file):
            f = files[rel]
            f.file_path.unlink(missing_ok=True)
            removed.append(str(f.file_path))
            if not any(o.blob_path == f.blob_path for r2 in repo.revisions for o in r2.files if o is not f
                       and o.file_path.exists()):
                f.blob_path.unlink(missing_ok=True)
    return removed
