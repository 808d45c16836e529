"""Usage errors: each one exits 2 and shows the usage of the command it was made in, with
the closest spelling when a word is near one that exists ("did you mean").

argparse leaves an option that a subcommand does not know to the top-level parser,
which then prints the top-level usage; Parser makes each subcommand refuse its own
unknown options. Errors found after parsing (a bad duration, an unknown state) go
through fail(), which prints the same way.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: commands start sooner
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

EXIT_USAGE = 2


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The closest of `choices` as " (did you mean 'X'?)", or "" when none is close."""
    import difflib

    # Compared without their leading dashes: every option shares those.
    bare = {c.lstrip("-"): c for c in choices}
    close = difflib.get_close_matches(word.lstrip("-"), list(bare), n=1, cutoff=0.7)
    return f" (did you mean {bare[close[0]]!r}?)" if close else ""


def _long_options(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions for o in a.option_strings if o.startswith("--")]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose invalid choices name the closest one, and whose
    subcommands refuse their own unknown options."""

    def add_subparsers(self, **kwargs: Any) -> Any:
        top = self

        class _Sub(SubParser):
            parent = top

        kwargs.setdefault("parser_class", _Sub)
        return super().add_subparsers(**kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            if action.choices is None or not isinstance(value, str):
                raise
            choices = [str(c) for c in action.choices]
            hint = did_you_mean(value, choices)
            if not hint:
                raise
            # The suggestion first: the list of every choice is long (all the commands).
            message = f"invalid choice: {value!r}{hint}; choose from {', '.join(choices)}"
            raise argparse.ArgumentError(action, message) from exc


class SubParser(Parser):
    """A subcommand's parser: an argument it does not know is its usage error."""

    parent: argparse.ArgumentParser | None = None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return ns, extras

    def unrecognized(self, extras: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        option = next((e.partition("=")[0] for e in extras if e.startswith("--")), None)
        if option is None:
            return message
        if self.parent is not None and option in _long_options(self.parent):
            return f"{message} ({option} is gpusv's own option: give it before the command)"
        return message + did_you_mean(option, _long_options(self))


def subparser(p: argparse.ArgumentParser, cmd: str | None) -> argparse.ArgumentParser:
    """The parser of command `cmd` (the top-level one when there is none)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction) and cmd in action.choices:
            chosen: argparse.ArgumentParser = action.choices[cmd]
            return chosen
    return p


def fail(top: argparse.ArgumentParser, cmd: str | None, message: str) -> int:
    """A usage error found after parsing: the usage of command `cmd` of parser `top` and
    the reason, as argparse prints its own; the exit code."""
    p = subparser(top, cmd)
    p.print_usage(sys.stderr)
    sys.stderr.write(f"{p.prog}: error: {message}\n")
    return EXIT_USAGE
