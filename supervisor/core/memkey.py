"""The default memory key: which earlier runs are the same kind of job as this one.

Pure. The kind of a job is its program, resolved to one path, with the script or scene it
runs, and its options; the files it reads and writes, paths and numbers are generalised,
so an encode of `in/a.mp4` and one of `in/b.mp4` share a key while another codec option
does not. Wrappers that do not change what runs (`env VAR=x`, `nice`, `timeout`) are
looked through; `sh -c 'code'` is read as the commands in its code. The rule is
described for operators in docs/host-memory.md.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from supervisor.core.memkey_programs import (
    CODE_INTERPRETERS,
    LAUNCHER_MODULES,
    LAUNCHERS,
    OUTPUT_OPTIONS,
    RUN_VERBS,
    RUNNERS,
    SCRIPT_EXTENSIONS,
    SHELLS,
    WRAPPERS,
    is_python,
)

# Finds a program on the job's PATH, as one path (symlinks resolved); None: not found.
Which = Callable[[str], str | None]

_HEAD_CHARS = 60
_DEPTH = 4  # `sh -c "sh -c '...'"` is read this deep, then kept as text
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# A number, a list, range or size of numbers, with a short unit: 8, 3e-4, 0-3, 512x512,
# 00:01:30.5, 5M, 30s, 1080p.
_NUMBER = re.compile(rf"{_NUM}(?:[x:,/\-]{_NUM})*[A-Za-z%]{{0,3}}")
# A file: a name with an extension (`in/a.mp4`, `img_%04d.png`, `model.safetensors`).
_FILE = re.compile(r"[^=]*[^/\s.=]\.([A-Za-z][A-Za-z0-9]{0,11})")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_SHORT_WITH_NUMBER = re.compile(r"-[A-Za-z]\d+")  # -j8, -n4
_PIECES = re.compile(r"([=,:;])")
_SHELL_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", ";;", "|&", "(", ")"})


@dataclass(frozen=True)
class _Ctx:
    cwd: str | None
    which: Which | None
    depth: int = 0

    def deeper(self) -> _Ctx:
        return replace(self, depth=self.depth + 1)


def general(word: str) -> str:
    """A word with its particulars generalised: a number is `N`, a file `*.ext`, a path
    `PATH`; in `k=v`, `a:b`, `a,b` each numeric piece is `N`. Other words (a codec, a
    subcommand, a model id such as `org/model-7b`) are kept: they say what the job is."""
    if not word:
        return word
    if _NUMBER.fullmatch(word):
        return "N"
    found = _FILE.fullmatch(word)
    if found:
        return "*." + found.group(1).lower()
    if _is_path(word):
        return "PATH"
    return "".join("N" if _NUMBER.fullmatch(p) else p for p in _PIECES.split(word))


def _is_path(word: str) -> bool:
    return (
        word.startswith(("/", "./", "../", "~"))
        or word.endswith("/")
        or word.count("/") >= 2
        or "#" in word
        or "%" in word
    )


def kind_words(
    argv: Sequence[str], *, cwd: str | None = None, which: Which | None = None
) -> list[str]:
    """The words that name the kind of job: the program (resolved with `which`, or
    against `cwd` when given as a path), its script resolved against `cwd`, and every
    other word generalised (see `general`); an output option's value is `OUT`."""
    if not argv:
        raise ValueError("mem_key needs a command")
    out: list[str] = []
    _command(list(argv), _Ctx(cwd, which), out)
    return out or [general(argv[-1])]


def _command(argv: list[str], ctx: _Ctx, out: list[str]) -> None:
    argv = _unwrapped(argv)
    if not argv:
        return
    name = os.path.basename(argv[0]) or argv[0]
    out.append(_program(argv[0], ctx))
    rest = argv[1:]
    if is_python(name):
        _python(rest, ctx, out)
    elif name in SHELLS:
        _shell(rest, ctx, out)
    elif name in CODE_INTERPRETERS:
        _interpreter(rest, ctx, out, CODE_INTERPRETERS[name])
    elif name == "blender":
        _blender(rest, ctx, out)
    elif name == "java":
        _java(rest, ctx, out)
    elif name in LAUNCHERS:
        _launcher(rest, ctx, out)
    elif name in RUNNERS:
        _runner(rest, ctx, out, RUNNERS[name])
    elif name in RUN_VERBS and rest[:1] == [RUN_VERBS[name][0]]:
        out.append(rest[0])
        if RUN_VERBS[name][0] == "launch":
            _launcher(rest[1:], ctx, out)
        else:
            _runner(rest[1:], ctx, out, RUN_VERBS[name][1])
    else:
        _args(rest, out)


def _unwrapped(argv: list[str]) -> list[str]:
    """argv past leading `VAR=x` words and wrappers that change how, not what, runs."""
    while argv:
        if _ASSIGNMENT.fullmatch(argv[0]):
            argv = argv[1:]
            continue
        name = os.path.basename(argv[0])
        if name not in WRAPPERS:
            return argv
        valued, positionals = WRAPPERS[name]
        i = 1
        while i < len(argv):
            word = argv[i]
            if word == "--":
                i += 1
                break
            if word in valued:
                i += 2
            elif (word.startswith("-") and len(word) > 1) or (
                name == "env" and _ASSIGNMENT.fullmatch(word)
            ):
                i += 1
            else:
                break
        argv = argv[i + positionals :]
    return argv


def _program(word: str, ctx: _Ctx) -> str:
    if "/" in word:
        return _resolved(word, ctx)
    found = ctx.which(word) if ctx.which is not None else None
    if found:
        return found
    if _FILE.fullmatch(word):  # a script run by a runner: `uv run train.py`
        return _resolved(word, ctx)
    return word


def _resolved(path: str, ctx: _Ctx) -> str:
    if path == "-":  # the script on stdin
        return path
    if ctx.cwd is not None:
        return os.path.normpath(os.path.join(ctx.cwd, path))
    return os.path.normpath(path)


def _args(words: Sequence[str], out: list[str]) -> None:
    i = 0
    while i < len(words):
        word = words[i]
        if word in OUTPUT_OPTIONS:
            out.append(word)
            if i + 1 < len(words):
                out.append("OUT")
            i += 2
            continue
        if word.startswith("-") and len(word) > 1 and not _NUMBER.fullmatch(word):
            name, eq, value = word.partition("=")
            if eq:
                out.append(f"{name}={'OUT' if name in OUTPUT_OPTIONS else general(value)}")
            elif _SHORT_WITH_NUMBER.fullmatch(word):
                out.append(word[:2] + "N")
            else:
                out.append(word)
        else:
            out.append(general(word))
        i += 1


def _python(rest: list[str], ctx: _Ctx, out: list[str]) -> None:
    """Interpreter flags (-u, -O, -X dev) are left out: the script is what runs."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in ("-m", "-c") and i + 1 < len(rest):
            out += [word, _code(rest[i + 1]) if word == "-c" else rest[i + 1]]
            if word == "-m" and rest[i + 1] in LAUNCHER_MODULES:
                _launcher(rest[i + 2 :], ctx, out)
            else:
                _args(rest[i + 2 :], out)
            return
        if word in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
        elif word.startswith("-") and word != "-":
            i += 1
        else:
            out.append(_resolved(word, ctx))
            _args(rest[i + 1 :], out)
            return


def _shell(rest: list[str], ctx: _Ctx, out: list[str]) -> None:
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in ("-o", "+o", "-O", "+O"):
            i += 2
        elif word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            out.append("-c")  # -c, -lc, -ec: the code is the next word
            if i + 1 < len(rest):
                out.append(_shell_code(rest[i + 1], ctx))
            _args(rest[i + 2 :], out)
            return
        elif word.startswith(("-", "+")) and word != "-":
            i += 1  # a flag, or `--`
        else:
            out.append(_resolved(word, ctx))
            _args(rest[i + 1 :], out)
            return


def _shell_code(code: str, ctx: _Ctx) -> str:
    """The commands of `sh -c CODE`, each read as a command line, joined as one word."""
    if ctx.depth >= _DEPTH:
        return _code(code)
    try:
        lexer = shlex.shlex(code, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not something to read further
        return _code(code)
    words: list[str] = []
    command: list[str] = []
    inner = ctx.deeper()
    for token in [*tokens, ";"]:
        if token in _SHELL_SEPARATORS:
            if command:
                _command(command, inner, words)
            if len(command) == 2 and command[0] == "cd" and inner.cwd is not None:
                # `cd dir && ./run.sh`: what follows runs there
                inner = replace(inner, cwd=os.path.join(inner.cwd, command[1]))
            command = []
            words.append(token)
        else:
            command.append(token)
    return " ".join(words[:-1])


def _code(code: str) -> str:
    return " ".join(code.split())


def _interpreter(rest: list[str], ctx: _Ctx, out: list[str], code_options: frozenset[str]) -> None:
    """node, perl, ruby, Rscript...: `-e CODE` is the program, else the first argument."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in code_options and i + 1 < len(rest):
            out += [word, _code(rest[i + 1])]
            _args(rest[i + 2 :], out)
            return
        if word.startswith("-") and word != "-":
            i += 1
        else:
            out.append(_resolved(word, ctx))
            _args(rest[i + 1 :], out)
            return


def _blender(rest: list[str], ctx: _Ctx, out: list[str]) -> None:
    """The scene (a .blend) and a -P/--python script are the program; the rest is
    generalised (frames, output, engine)."""
    args: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in ("-P", "--python") and i + 1 < len(rest):
            out += [word, _resolved(rest[i + 1], ctx)]
            i += 2
            continue
        if not word.startswith("-") and word.lower().endswith(".blend"):
            out.append(_resolved(word, ctx))
        else:
            args.append(word)
        i += 1
    _args(args, out)


def _java(rest: list[str], ctx: _Ctx, out: list[str]) -> None:
    """`java -jar app.jar`: the jar is the program; else the main class, as written."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "-jar" and i + 1 < len(rest):
            out += [word, _resolved(rest[i + 1], ctx)]
            _args(rest[i + 2 :], out)
            return
        if word in ("-cp", "-classpath", "--class-path", "-p", "--module-path"):
            _args(rest[i : i + 2], out)
            i += 2
        elif word.startswith("-"):
            _args([word], out)  # -Xmx4g: the heap's size is what the job is
            i += 1
        else:
            out.append(word)
            _args(rest[i + 1 :], out)
            return


def _launcher(rest: list[str], ctx: _Ctx, out: list[str]) -> None:
    """torchrun, deepspeed, `accelerate launch`, `python -m torch.distributed.run`: the
    first script (or `-m module`) is the program; options before it are the launcher's."""
    for i, word in enumerate(rest):
        if word in ("-m", "--module") and i + 1 < len(rest):
            _args(rest[:i], out)
            out += [word, rest[i + 1]]
            _args(rest[i + 2 :], out)
            return
        if not word.startswith("-") and os.path.splitext(word)[1] in SCRIPT_EXTENSIONS:
            _args(rest[:i], out)
            out.append(_resolved(word, ctx))
            _args(rest[i + 1 :], out)
            return
    _args(rest, out)


def _runner(rest: list[str], ctx: _Ctx, out: list[str], valued: frozenset[str]) -> None:
    """mpirun, srun, `uv run`, `conda run`: options, then a command of its own."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            _command(rest[i + 1 :], ctx.deeper(), out)
            return
        if word in valued:
            _args(rest[i : i + 2], out)
            i += 2
        elif word.startswith("-") or _NUMBER.fullmatch(word):
            _args([word], out)
            i += 1
        else:
            _command(rest[i:], ctx.deeper(), out)
            return


def _head(words: Sequence[str]) -> str:
    """The key's readable part: paths shown by their last part, whitespace as one space."""
    shown = " ".join(
        os.path.basename(t) if t.startswith("/") and len(t) > 1 else t
        for w in words
        for t in w.split()
    )
    if len(shown) > _HEAD_CHARS:
        shown = shown[: _HEAD_CHARS - 3].rstrip() + "..."
    return shown


def mem_key(
    argv: Sequence[str],
    explicit: str | None = None,
    *,
    cwd: str | None = None,
    which: Which | None = None,
) -> str:
    """`explicit` when given, else a readable head of the kind's words plus 8 hex digits
    of a SHA-256 over them (so two keys whose heads read alike still differ)."""
    if explicit is not None and explicit.strip():
        return explicit.strip()
    words = kind_words(argv, cwd=cwd, which=which)
    raw = "\0".join(words).encode("utf-8", "surrogateescape")
    return f"{_head(words)}#{hashlib.sha256(raw).hexdigest()[:8]}"
