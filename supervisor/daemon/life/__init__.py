"""Life: the daemon's life from start to exit, and the one place that sees every room.

`app.py` is the composition root: it builds every service with what it needs, reconciles
(`recovery.py`), runs one task group and drains (`shutdown.py`, `leaving.py`). Around it:
start-up chores (`startup.py`, `space.py`), SIGHUP (`reload.py`), the abort deadman and its
forensics (`deadman.py`, `forensics.py`), systemd's notify protocol and watchdog
(`systemd.py`) and logging (`log_setup.py`). Nothing outside this room imports it.
"""
