"""The keeper's search of a job's PATH (keeper/direct.py): as execvpe's, and reused for
FOUND_FOR_S while the file found may still be executed, so that a sweep of one command
does not miss a dozen folders at each job. Real files in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.keeper import direct
from supervisor.keeper.spawn import Spec


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [1000.0]
    monkeypatch.setattr(direct, "_clock", lambda: now[0])
    direct._found.clear()
    yield now
    direct._found.clear()


def spec(tmp_path: Path, *folders: Path) -> Spec:
    path = ":".join(str(f) for f in folders)
    return Spec(1, 1, ("tool",), str(tmp_path), {"PATH": path}, "/dev/null", "/dev/null")


def tool(folder: Path, mode: int = 0o755) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "tool"
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_a_binary_installed_earlier_in_the_path_is_taken_once_the_search_is_stale(
    tmp_path: Path, clock: list[float]
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    later = tool(second)
    job = spec(tmp_path, first, second)
    assert direct._executable(job) == str(later)
    earlier = tool(first)
    clock[0] += direct.FOUND_FOR_S / 2
    assert direct._executable(job) == str(later)  # within the reuse: as a shell's hash
    clock[0] += direct.FOUND_FOR_S
    assert direct._executable(job) == str(earlier)


def test_a_found_binary_removed_or_made_unrunnable_is_searched_for_again_at_once(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    found, other = tool(first), tool(second)
    job = spec(tmp_path, first, second)
    assert direct._executable(job) == str(found)
    found.chmod(0o644)
    assert direct._executable(job) == str(other)
    other.unlink()
    with pytest.raises(direct.Failed, match="permission denied executing tool"):
        direct._executable(job)  # what is left may not be run
    found.unlink()
    with pytest.raises(direct.Failed, match="executable not found: tool"):
        direct._executable(job)


def test_another_path_or_directory_is_a_search_of_its_own(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    in_first, in_second = tool(first), tool(second)
    assert direct._executable(spec(tmp_path, first, second)) == str(in_first)
    assert direct._executable(spec(tmp_path, second, first)) == str(in_second)
