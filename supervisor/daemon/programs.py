"""Where a job's program is: the memory key names a program by one path."""

from __future__ import annotations

import os
import shutil
from functools import cache

from supervisor.core.memkey import Which


def program_finder(path: str | None) -> Which:
    """A program found on a job's PATH (`os.defpath` when it has none), as one path
    with symlinks resolved, so that `python3` and `/usr/bin/python3` are one program.
    Each name is looked up once per finder: a batch of a thousand lines reads the file
    system a few times, not a thousand."""
    search = os.defpath if path is None else path

    @cache
    def which(name: str) -> str | None:
        found = shutil.which(name, path=search)
        return os.path.realpath(found) if found else None

    return which
