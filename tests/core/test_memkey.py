from __future__ import annotations

import re

import pytest

from supervisor.core.memkey import general, kind_words, mem_key

# The job's PATH, as the daemon would find programs on it (symlinks resolved).
PROGRAMS = {
    "python3": "/usr/bin/python3.12",
    "python": "/usr/bin/python3.12",
    "ffmpeg": "/usr/bin/ffmpeg",
    "bash": "/usr/bin/bash",
    "sh": "/usr/bin/dash",
    "torchrun": "/opt/venv/bin/torchrun",
    "blender": "/opt/blender/blender",
    "sleep": "/usr/bin/sleep",
    "echo": "/usr/bin/echo",
}
CWD = "/home/ana/proj"


def key(*argv: str, cwd: str = CWD) -> str:
    return mem_key(argv, cwd=cwd, which=PROGRAMS.get)


def words(*argv: str) -> list[str]:
    return kind_words(argv, cwd=CWD, which=PROGRAMS.get)


def test_explicit_key_wins_and_is_trimmed() -> None:
    assert mem_key(["python3", "train.py"], " llama-70b ") == "llama-70b"


def test_blank_explicit_key_falls_back_to_the_command() -> None:
    assert mem_key(["python3", "train.py"], "  ") == mem_key(["python3", "train.py"], None)


def test_mem_key_without_a_command_says_so() -> None:
    with pytest.raises(ValueError, match=r"^mem_key needs a command$"):
        mem_key([])


# ---- an encode batch: one kind ---------------------------------------------------------


def test_an_encode_of_other_files_is_the_same_kind() -> None:
    a = key("ffmpeg", "-i", "in/a.mp4", "-c:v", "libx264", "-crf", "23", "out/a.mkv")
    b = key("ffmpeg", "-i", "in/b.mp4", "-c:v", "libx264", "-crf", "28", "out/b.mkv")
    elsewhere = key("ffmpeg", "-i", "/data/c.mp4", "-c:v", "libx264", "-crf", "23", "c.mkv")
    assert a == b == elsewhere


def test_another_codec_or_container_is_another_kind() -> None:
    x264 = key("ffmpeg", "-i", "in/a.mp4", "-c:v", "libx264", "out/a.mkv")
    assert x264 != key("ffmpeg", "-i", "in/a.mp4", "-c:v", "libx265", "out/a.mkv")
    assert x264 != key("ffmpeg", "-i", "in/a.mp4", "-c:v", "libx264", "out/a.mp4")
    assert x264 != key("ffmpeg", "-i", "in/a.mp4", "-c:v", "libx264", "-an", "out/a.mkv")


def test_a_filter_with_other_numbers_is_the_same_kind() -> None:
    small = key("ffmpeg", "-i", "a.mov", "-vf", "scale=1280:720", "-b:v", "5M", "a.webm")
    large = key("ffmpeg", "-i", "b.mov", "-vf", "scale=1920:1080", "-b:v", "8M", "b.webm")
    assert small == large
    assert small != key("ffmpeg", "-i", "b.mov", "-vf", "crop=1920:1080", "-b:v", "8M", "b.webm")


def test_an_encode_reads_as_its_program_and_options() -> None:
    argv = ("ffmpeg", "-y", "-i", "in/a.mp4", "-c:v", "libx264", "-crf", "23", "out/a.mkv")
    assert re.fullmatch(r"ffmpeg -y -i \*\.mp4 -c:v libx264 -crf N \*\.mkv#[0-9a-f]{8}", key(*argv))


# ---- the program resolved to one path --------------------------------------------------


def test_a_script_by_its_absolute_path_or_from_its_directory_is_one_program() -> None:
    assert key("python3", "/home/ana/proj/hog.py", "400") == key("python3", "hog.py", "400")
    assert key("python3", "./hog.py") == key("python3", "../proj/hog.py")
    assert key("python3", "hog.py") != key("python3", "hog.py", cwd="/home/bo")
    assert key("python3", "hog.py") != key("python3", "other.py")


def test_the_interpreter_is_found_on_path() -> None:
    assert key("python3", "hog.py") == key("/usr/bin/python3.12", "hog.py")
    assert key("python3", "hog.py") == key("python", "hog.py")  # one file behind both names
    assert key("python3", "hog.py") != key("/opt/venv/bin/python", "hog.py")


def test_a_program_given_as_a_relative_path_is_resolved_against_the_cwd() -> None:
    assert key("./render", "5") == key("/home/ana/proj/render", "7")
    assert words("./render", "scene.blend") == ["/home/ana/proj/render", "*.blend"]


def test_a_program_not_on_path_is_kept_by_name() -> None:
    assert words("mytool", "--fast") == ["mytool", "--fast"]


def test_without_a_cwd_or_path_words_are_kept_as_given() -> None:
    assert kind_words(["python3", "hog.py"]) == ["python3", "hog.py"]


# ---- python ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ("python3", "train.py", "--seed", "1"),
            ["/usr/bin/python3.12", f"{CWD}/train.py", "--seed", "N"],
        ),
        (("python3", "-u", "-X", "dev", "train.py"), ["/usr/bin/python3.12", f"{CWD}/train.py"]),
        (
            ("python3", "-m", "pkg.train", "--lr", "3e-4"),
            ["/usr/bin/python3.12", "-m", "pkg.train", "--lr", "N"],
        ),
        (
            ("python3", "-c", "import x;  x.run()"),
            ["/usr/bin/python3.12", "-c", "import x; x.run()"],
        ),
        (
            ("python3", "gen.py", "--out=o.png", "--prompt", "a cat", "in.png"),
            ["/usr/bin/python3.12", f"{CWD}/gen.py", "--out=OUT", "--prompt", "a cat", "*.png"],
        ),
        (
            ("python3", "train.py", "--resume", "checkpoints/step_00042.pt", "-j8"),
            ["/usr/bin/python3.12", f"{CWD}/train.py", "--resume", "*.pt", "-jN"],
        ),
        (
            ("python3", "train.py", "--model", "meta-llama/Llama-2-7b", "--device", "cuda:1"),
            [
                "/usr/bin/python3.12",
                f"{CWD}/train.py",
                "--model",
                "meta-llama/Llama-2-7b",
                "--device",
                "cuda:N",
            ],
        ),
    ],
)
def test_python_command_lines(argv: tuple[str, ...], expected: list[str]) -> None:
    assert words(*argv) == expected


def test_numbered_checkpoints_and_outputs_share_a_key() -> None:
    a = key("python3", "eval.py", "--ckpt", "runs/7/ckpt_0100.pt", "-o", "res_100.json")
    b = key("python3", "eval.py", "--ckpt", "runs/8/ckpt_0200.pt", "-o", "res_200.json")
    assert a == b


def test_a_model_of_another_size_is_another_kind() -> None:
    small = key("python3", "serve.py", "--model", "Qwen/Qwen2.5-7B")
    assert small != key("python3", "serve.py", "--model", "Qwen/Qwen2.5-72B")


# ---- launchers, wrappers, shells --------------------------------------------------------


def test_torchrun_runs_the_script_it_names() -> None:
    argv = ("torchrun", "--standalone", "--nproc_per_node", "2", "train.py", "--bs", "8")
    assert words(*argv) == [
        "/opt/venv/bin/torchrun", "--standalone", "--nproc_per_node", "N", f"{CWD}/train.py",
        "--bs", "N",
    ]  # fmt: skip
    assert key(*argv) != key("torchrun", "--standalone", "--nproc_per_node", "2", "eval.py")
    assert key(*argv) == key(
        "torchrun", "--standalone", "--nproc_per_node", "4", f"{CWD}/train.py", "--bs", "16"
    )


def test_python_m_torch_distributed_run_is_a_launcher() -> None:
    a = key("python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "a.py")
    assert a != key("python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "b.py")
    assert "a.py" in a


def test_accelerate_launch_and_uv_run() -> None:
    assert words("accelerate", "launch", "--num_processes", "2", "train.py") == [
        "accelerate", "launch", "--num_processes", "N", f"{CWD}/train.py",
    ]  # fmt: skip
    assert words("uv", "run", "train.py", "--lr", "1") == [
        "uv", "run", f"{CWD}/train.py", "--lr", "N",
    ]  # fmt: skip
    assert words("mpirun", "-np", "4", "python3", "t.py") == [
        "mpirun", "-np", "N", "/usr/bin/python3.12", f"{CWD}/t.py",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "prefix",
    [
        ("env", "OMP_NUM_THREADS=4"),
        ("env", "-u", "DISPLAY", "A=1", "B=2"),
        ("nice", "-n", "10"),
        ("timeout", "2h"),
        ("timeout", "-k", "10", "1h", "nohup"),
        ("taskset", "-c", "0-3"),
        ("stdbuf", "-oL"),
        ("numactl", "--cpunodebind=0", "--membind=0"),
    ],
)
def test_wrappers_and_env_prefixes_are_looked_through(prefix: tuple[str, ...]) -> None:
    assert key(*prefix, "python3", "hog.py", "x.mp4") == key("python3", "hog.py", "y.mp4")


def test_bash_c_is_read_as_the_commands_in_its_code() -> None:
    a = key("bash", "-c", "ffmpeg -i in/a.mp4 out/a.mkv && echo done >> log.txt")
    b = key("bash", "-c", "ffmpeg  -i 'in/b c.mp4' out/b.mkv && echo done >> log.txt")
    assert a == b
    assert a != key("bash", "-c", "ffmpeg -i in/a.mp4 -c:v libx265 out/a.mkv && echo done")
    assert words("bash", "-lc", "OMP=2 python3 hog.py 400 | tee out.log") == [
        "/usr/bin/bash", "-c", f"/usr/bin/python3.12 {CWD}/hog.py N | tee *.log",
    ]  # fmt: skip
    assert key("sh", "-c", "python3 hog.py") == key("sh", "-c", f"python3 {CWD}/hog.py")


def test_a_cd_in_shell_code_moves_the_scripts_after_it() -> None:
    assert words("sh", "-c", "cd /data && ./run.sh 5") == [
        "/usr/bin/dash", "-c", "cd PATH && /data/run.sh N",
    ]  # fmt: skip
    assert words("sh", "-c", "cd sub; python3 hog.py") == [
        "/usr/bin/dash", "-c", f"cd sub ; /usr/bin/python3.12 {CWD}/sub/hog.py",
    ]  # fmt: skip


def test_java_runs_its_jar_or_its_main_class() -> None:
    assert words("java", "-Xmx4g", "-jar", "app.jar", "in.csv") == [
        "java", "-Xmx4g", "-jar", f"{CWD}/app.jar", "*.csv",
    ]  # fmt: skip
    assert words("java", "-cp", "lib/a.jar", "com.acme.Main", "7") == [
        "java", "-cp", "*.jar", "com.acme.Main", "N",
    ]  # fmt: skip


def test_shell_code_that_does_not_parse_is_kept_as_text() -> None:
    assert words("sh", "-c", "echo 'unbalanced") == ["/usr/bin/dash", "-c", "echo 'unbalanced"]


def test_a_shell_script_is_its_program() -> None:
    assert key("bash", "-e", "run.sh", "1") == key("bash", "run.sh", "2")
    assert key("bash", "run.sh") != key("bash", "other.sh")


def test_blender_scene_and_script_are_the_program() -> None:
    frame = ("blender", "-b", "scene.blend", "-E", "CYCLES", "-o", "out/frame_####", "-f")
    assert key(*frame, "1") == key(*frame, "2")
    assert key(*frame, "1") != key("blender", "-b", "city.blend", "-E", "CYCLES", "-f", "1")
    assert words("blender", "-b", "s.blend", "-P", "bake.py") == [
        "/opt/blender/blender", f"{CWD}/s.blend", "-P", f"{CWD}/bake.py", "-b",
    ]  # fmt: skip


def test_node_and_perl_code_options() -> None:
    assert words("node", "-e", "run(1)") == ["node", "-e", "run(1)"]
    assert words("perl", "script.pl", "in.txt") == ["perl", f"{CWD}/script.pl", "*.txt"]


# ---- words -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("8", "N"),
        ("3e-4", "N"),
        ("-0.5", "N"),
        ("0-3", "N"),
        ("512x512", "N"),
        ("00:01:30.5", "N"),
        ("5M", "N"),
        ("1080p", "N"),
        ("in/a.mp4", "*.mp4"),
        ("IMG_001.JPG", "*.jpg"),
        ("img_%04d.png", "*.png"),
        ("model.safetensors", "*.safetensors"),
        ("/data/set1", "PATH"),
        ("./out", "PATH"),
        ("out/frames/", "PATH"),
        ("out/frame_####", "PATH"),
        ("libx264", "libx264"),
        ("h264_nvenc", "h264_nvenc"),
        ("meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b"),
        ("scale=1280:-2", "scale=N:N"),
        ("cuda:0", "cuda:N"),
        ("", ""),
    ],
)
def test_general(word: str, shown: str) -> None:
    assert general(word) == shown


def test_key_format_is_a_head_and_a_digest() -> None:
    assert re.fullmatch(r"python3\.12 train\.py#[0-9a-f]{8}", key("python3", "-u", "train.py"))
    # Joining with spaces must not merge distinct argv splits.
    assert key("prog", "a b") != key("prog", "a", "b")


def test_long_keys_get_a_short_readable_head() -> None:
    k = key("python3", "train.py", "--config", "c.yaml", *(["--flag-" + "x" * 10] * 8))
    head, _, digest = k.rpartition("#")
    assert head.startswith("python3.12 train.py --config *.yaml --flag-")
    assert head.endswith("...")
    assert len(head) <= 60
    assert re.fullmatch(r"[0-9a-f]{8}", digest)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # digests from `printf 'a\0b' | sha256sum`: the key is stable across releases
        (("sleep", "1.5"), "sleep N#b7e086e8"),
        (("python3", "train.py"), "python3.12 train.py#ac30d633"),
    ],
)
def test_mem_key_by_table(argv: tuple[str, ...], expected: str) -> None:
    assert key(*argv) == expected


@pytest.mark.timeout(60)
def test_a_long_word_costs_linear_time() -> None:
    """The submit path runs on the daemon's loop: no word may make a pattern backtrack
    over it quadratically. 40,000 digits take milliseconds; under a pattern with two
    ways to split a run of digits they took minutes (the timeout's failure)."""
    for word in ("1" * 40_000 + "!", "1." * 20_000 + "!", "1x" * 20_000 + "!", "a." * 20_000 + "="):
        assert general(word) == word or general(word) in ("N", "PATH")
        kind_words(["sh", "-c", word])
