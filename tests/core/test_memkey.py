from __future__ import annotations

import re

import pytest

from supervisor.core.memkey import mem_key, program_words


def test_explicit_key_wins_and_is_trimmed() -> None:
    assert mem_key(["python3", "train.py"], " llama-70b ") == "llama-70b"


def test_blank_explicit_key_falls_back_to_the_command() -> None:
    assert mem_key(["python3", "train.py"], "  ") == mem_key(["python3", "train.py"], None)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["python", "train.py", "--seed", "1"], ["python", "train.py"]),
        (["/usr/bin/python3", "train.py", "--bs", "8"], ["python3", "train.py"]),
        (
            ["blender", "-b", "scene.blend", "-o", "out/frame_####", "-f", "1"],
            ["blender", "scene.blend"],
        ),
        (["blender", "-b", "city.blend", "-o", "/tmp/x.png", "-f", "7"], ["blender", "city.blend"]),
        (
            ["python3", "-m", "pkg.train", "--config=cfg/a.yaml", "--lr", "0.1"],
            ["python3", "-m", "pkg.train", "--config=cfg/a.yaml"],
        ),
        (
            ["python", "gen.py", "--out=o.png", "--prompt", "a cat", "in.png"],
            ["python", "gen.py", "in.png"],
        ),
        (["sh", "-c", "a b"], ["sh", "-c", "a b"]),
        (["./render", "5", "1e-3", "img_%04d.png"], ["render"]),
        (["sleep", "1.5"], ["sleep"]),
    ],
)
def test_program_words(argv: list[str], words: list[str]) -> None:
    assert program_words(argv) == words


def test_same_program_other_parameters_share_a_key() -> None:
    assert mem_key(["python", "train.py", "--seed", "1"]) == mem_key(
        ["python", "train.py", "--seed", "2"]
    )
    frame = ["blender", "-b", "scene.blend", "-o", "out/frame_####", "-f"]
    assert mem_key([*frame, "1"]) == mem_key([*frame, "2"])
    assert mem_key([*frame, "1"]) != mem_key(["blender", "-b", "other.blend", "-f", "1"])
    assert mem_key(["python", "train.py"]) != mem_key(["python", "eval.py"])


def test_key_format_is_a_head_and_a_digest() -> None:
    assert re.fullmatch(r"python3 train\.py#[0-9a-f]{8}", mem_key(["python3", "train.py", "-v"]))
    # Joining with spaces must not merge distinct argv splits.
    assert mem_key(["sh", "-c", "a b"]) != mem_key(["sh", "-c", "a", "b"])


def test_long_keys_get_a_short_readable_head() -> None:
    key = mem_key(["python3", "train.py", "--config", "configs/" + "x" * 200 + ".yaml"])
    head, _, digest = key.rpartition("#")
    assert head.startswith("python3 train.py configs/")
    assert head.endswith("...")
    assert len(head) <= 40
    assert re.fullmatch(r"[0-9a-f]{8}", digest)


def test_mem_key_needs_a_command() -> None:
    with pytest.raises(ValueError):
        mem_key([], None)


# --- the key by table (digests from `printf 'a\0b' | sha256sum`) --------------------------

A25 = "a" * 25
ALPHA = "abcdefghijklmnopqrstuvwxyz012.py"  # 32 characters


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["python3", "train.py"], "python3 train.py#0103711c"),
        (["/usr/bin/python3", "train.py", "--bs", "8"], "python3 train.py#0103711c"),
        # whitespace inside a word is one space in the head, and intact in the digest
        (["sh", "-c", "a  b\tc"], "sh -c a b c#1980a2b9"),
        # an executable with no basename is kept as it was given
        (["/", "x.py"], "/ x.py#8cd415ea"),
        # bytes that are not UTF-8 (os.fsdecode's surrogates) go into the digest as they were
        (["python3", "\udcff.py"], "python3 \udcff.py#d70e5b74"),
        # a head of exactly 40 characters is kept whole...
        (["python3", ALPHA], f"python3 {ALPHA}#76014275"),
        # ...a longer one is cut to 37, its trailing space dropped, and marked
        (["python3", f"{A25}.py", "tail-long-file.py"], f"python3 {A25}.py...#5eacc49e"),
    ],
)
def test_mem_key_by_table(argv: list[str], key: str) -> None:
    assert mem_key(argv) == key


def test_mem_key_without_a_command_says_so() -> None:
    with pytest.raises(ValueError, match=r"^mem_key needs a command$"):
        mem_key([])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["render", "-o", "out.png", "scene.blend"], ["render", "scene.blend"]),
        (["python", "-m"], ["python"]),  # a program option with nothing after it
        (["sh", "a.sh", "b.sh", "-c", "x", "c.sh"], ["sh", "a.sh", "b.sh", "-c", "x", "c.sh"]),
        (["prog", "cfg=a.yaml"], ["prog"]),  # not an option: one word, with an `=`
        (["prog", "--set=x=y.yaml"], ["prog"]),  # the value is everything after the first `=`
        (["render", "out_##.png"], ["render"]),  # a frame pattern is an output
    ],
)
def test_program_words_at_the_edges(argv: list[str], words: list[str]) -> None:
    assert program_words(argv) == words


def test_a_long_head_is_cut_at_37_characters_and_marked() -> None:
    key = mem_key(["python3", "train.py", "--config", "configs/" + "x" * 200 + ".yaml"])
    assert key.rpartition("#")[0] == "python3 train.py configs/" + "x" * 12 + "..."
