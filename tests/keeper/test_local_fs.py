"""Which paths a keeper may touch itself (keeper/local_fs.py): told from the mount table
alone, following symbolic links only through file systems of this machine's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.keeper import local_fs
from supervisor.keeper.local_fs import LocalPaths, mount_types
from supervisor.keeper.spawn import Spec

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:31 / /home rw,relatime shared:9 master:2 - nfs4 srv:/home rw,vers=4.2
36 22 0:32 / /home rw,relatime - autofs systemd-1 rw
40 22 0:40 / /mnt/with\\040space rw - cifs //srv/share rw
41 22 0:41 / /scratch rw - fuse.sshfs u@h:/ rw
"""


def test_the_mount_table_is_read_with_its_escapes_and_the_mount_on_top_wins() -> None:
    types = mount_types(MOUNTINFO + "not a mount line\n")
    assert types == {
        "/": "ext4",
        "/home": "autofs",
        "/mnt/with space": "cifs",
        "/scratch": "fuse.sshfs",
    }


def _paths(tmp_path: Path, far: str) -> LocalPaths:
    """A table in which `far` is a network file system and the rest is ext4."""
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n50 22 0:50 / {far} rw - nfs4 s:/ rw\n")
    return LocalPaths(str(table))


def test_a_path_is_far_when_any_step_of_it_is_on_a_far_file_system(tmp_path: Path) -> None:
    far = tmp_path / "nfs"
    paths = _paths(tmp_path, str(far))
    (tmp_path / "near").mkdir()
    (tmp_path / "link").symlink_to(far / "x")  # a link into it, from a local directory
    (tmp_path / "hop").symlink_to("link")  # relative, and through another link
    (tmp_path / "back").symlink_to(tmp_path / "near")
    assert paths.far(str(tmp_path / "near")) is None
    assert paths.far(str(tmp_path / "missing" / "deeper")) is None  # fails at once
    assert paths.far(str(far)) == f"{far} (nfs4)"
    assert paths.far(str(far / "a" / "b")) == f"{far} (nfs4)"
    assert paths.far(str(tmp_path / "link" / "y")) == f"{far} (nfs4)"
    assert paths.far(str(tmp_path / "hop")) == f"{far} (nfs4)"
    assert paths.far(str(tmp_path / "back")) is None
    assert paths.far(str(tmp_path / "near" / ".." / "nfs" / "z")) == f"{far} (nfs4)"
    (tmp_path / "loop").symlink_to("loop")
    assert paths.far(str(tmp_path / "loop")) is None  # ELOOP at once, as the kernel says


def _spec(cwd: Path, argv: list[str], path: str) -> Spec:
    return Spec(1, 1, tuple(argv), str(cwd), {"PATH": path}, "/dev/null", "/dev/null")


def test_a_start_is_far_where_its_search_or_its_exec_would_touch_a_far_file_system(
    tmp_path: Path,
) -> None:
    far = tmp_path / "nfs"
    paths = _paths(tmp_path, str(far))
    near = tmp_path / "bin"
    near.mkdir()
    tool = near / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    script = near / "script"
    script.write_text(f"#!{far}/python -u\n")
    script.chmod(0o755)
    said = f"{far} (nfs4)"
    assert paths.start(_spec(tmp_path, ["tool"], f"{near}:{far}")) is None  # found first
    assert paths.start(_spec(tmp_path, ["tool"], f"{far}:{near}")) == said  # searched first
    assert paths.start(_spec(tmp_path, ["absent"], f"{near}")) is None
    assert paths.start(_spec(far, ["tool"], f"{near}")) == said  # the working directory
    assert paths.start(_spec(tmp_path, [f"{far}/tool"], "")) == said
    assert paths.start(_spec(tmp_path, ["script"], f"{near}")) == said  # its interpreter
    assert paths.start(_spec(tmp_path, ["./bin/tool"], "")) is None  # relative to its cwd


def test_an_answer_is_kept_for_a_while(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _paths(tmp_path, str(tmp_path / "nfs"))
    spec = _spec(tmp_path, ["tool"], str(tmp_path / "bin"))
    assert paths.start(spec) is None
    (tmp_path / "bin").symlink_to(tmp_path / "nfs")  # now the folder is far
    assert paths.start(spec) is None  # the answer of a moment ago
    now = local_fs._clock()
    monkeypatch.setattr(local_fs, "_clock", lambda: now + local_fs.FOR_S + 1)
    assert paths.start(spec) == f"{tmp_path / 'nfs'} (nfs4)"


def test_this_machines_own_table_is_read() -> None:
    paths = LocalPaths()
    try:
        assert paths.types["/"]
        assert paths.where(os.getcwd())[0] in paths.types
    finally:
        paths.close()
