"""gpusvd's command line: every flag with what it sets (each has a config key too)."""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpusvd", description="gpusv job supervisor daemon")
    p.add_argument("--version", action="version", version=f"gpusvd {_version()}")
    p.add_argument(
        "--config",
        type=Path,
        help="TOML config file (default: $GPUSVD_CONFIG, else /etc/gpusvd.toml if it exists)",
    )
    p.add_argument("--state-dir", dest="state_dir", help="database and job logs directory")
    p.add_argument("--socket", help="Unix socket path to serve")
    p.add_argument(
        "--simulate-gpus", dest="simulate_gpus", metavar="NxSIZE", help="fake cards, e.g. 2x24G"
    )
    p.add_argument("--kernel-log", dest="kernel_log", help="auto, journal, kmsg, file:PATH or off")
    p.add_argument("--log-format", dest="log_format", help="console or json")
    p.add_argument(
        "--log-level", dest="log_level", default="info", help="debug, info, warning or error"
    )
    return p.parse_args(argv)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpusv")
    except PackageNotFoundError:
        return "unknown"
