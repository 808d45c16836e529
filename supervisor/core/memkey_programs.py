"""What the memory key knows of common programs: which wrap another command, which run
a script or code, which launch one on several processes. Pure data."""

from __future__ import annotations

import re

# Options whose value is where output goes: never what the job is.
OUTPUT_OPTIONS = frozenset(
    {"-o", "-O", "--output", "--out", "--outdir", "--output-dir", "--output_dir", "--render-output"}
)

# Wrappers that change how a command runs, not what runs: left out of the key. Each with
# its options that take a value, and how many words come after its options before the
# command (`timeout 1h cmd`, `taskset 0x3 cmd`, `chrt 10 cmd`).
WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "env": (frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}), 0),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "nohup": (frozenset(), 0),
    "setsid": (frozenset(), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e"}), 0),
    "ionice": (frozenset({"-c", "--class", "-n", "--classdata"}), 0),
    "taskset": (frozenset(), 1),
    "chrt": (frozenset(), 1),
    "timeout": (frozenset({"-s", "--signal", "-k", "--kill-after"}), 1),
    "numactl": (
        frozenset({"-C", "-N", "-m", "-p", "-i", "--cpunodebind", "--membind", "--preferred"}),
        0,
    ),
    "time": (frozenset({"-o", "--output", "-f", "--format"}), 0),
    "exec": (frozenset({"-a"}), 0),
    "command": (frozenset(), 0),
}

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox-sh", "fish"})

# Interpreters of a script or of code given inline, with their code options.
CODE_INTERPRETERS: dict[str, frozenset[str]] = {
    "node": frozenset({"-e", "--eval", "-p", "--print"}),
    "perl": frozenset({"-e", "-E"}),
    "ruby": frozenset({"-e"}),
    "Rscript": frozenset({"-e"}),
    "julia": frozenset({"-e", "--eval", "-E", "--print"}),
    "php": frozenset({"-r"}),
    "lua": frozenset({"-e"}),
    "luajit": frozenset({"-e"}),
}

_PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)?)?[dmu]?")


def is_python(name: str) -> bool:
    return _PYTHON.fullmatch(name) is not None


# Launchers of a script on several processes: the first script is the program.
LAUNCHERS = frozenset({"torchrun", "deepspeed"})
LAUNCHER_MODULES = frozenset(
    {"torch.distributed.run", "torch.distributed.launch", "deepspeed", "accelerate.commands.launch"}
)
SCRIPT_EXTENSIONS = frozenset({".py", ".sh", ".R", ".jl", ".js", ".pl", ".rb", ".lua"})

# Runners of a command of their own, with their options that take a value.
_MPI = frozenset(
    {"-np", "-n", "-c", "-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile",
     "-x", "--map-by", "--bind-to", "--rank-by", "-npernode", "--npernode", "-wdir", "--wdir",
     "-ppn", "-f"}
)  # fmt: skip
_SRUN = frozenset(
    {"-n", "-N", "-c", "-p", "-t", "-J", "-o", "-e", "-w", "-G", "-A", "-q", "--ntasks",
     "--nodes", "--cpus-per-task", "--partition", "--time", "--job-name", "--gres", "--mem",
     "--gpus", "--account", "--qos"}
)  # fmt: skip
RUNNERS: dict[str, frozenset[str]] = {
    "mpirun": _MPI,
    "mpiexec": _MPI,
    "srun": _SRUN,
    "xvfb-run": frozenset({"-s", "--server-args", "-n", "--server-num", "-f", "-e", "-p"}),
}
_ENV_RUN = frozenset(
    {"-n", "--name", "-p", "--prefix", "--with", "--python", "--project", "--directory",
     "--env-file", "-e", "--environment", "--package"}
)  # fmt: skip
# Tools whose verb runs a command (`uv run`, `conda run -n env`) or launches a script
# (`accelerate launch`).
RUN_VERBS: dict[str, tuple[str, frozenset[str]]] = {
    **{tool: ("run", _ENV_RUN) for tool in
       ("uv", "poetry", "pipenv", "conda", "mamba", "micromamba", "pixi", "pdm", "hatch", "rye")},
    "accelerate": ("launch", frozenset()),
}  # fmt: skip
