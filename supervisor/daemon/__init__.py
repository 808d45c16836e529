"""gpusvd, the daemon: the imperative shell around the pure rules of `supervisor.core`.

At this level live what every room shares: the engine (`engine.py`, the one writer of job
state: it steps the core, commits through the store, then publishes actions), the dispatcher
(`dispatcher.py`, admission passes), the broker (`broker.py`, the engine's events), the
engine's log lines (`event_log.py`), the job views clients and hooks see (`views.py`), memory
cgroups (`cgroups.py`, read by `watch/` and written for jobs by `running/`), the clock and
the configuration. Five rooms around them, each importing only this level and
the rooms before it in this list:

- `store/`: SQLite, its writer and schema, the engine's commit, queries, output files;
- `requests/`: the socket server and one handler module per group of verbs;
- `running/`: keepers, spawns and kills, OOM scores, what a launch is given;
- `watch/`: sampling, memory, GPUs, hangs, metrics, hooks;
- `life/`: the composition root, start-up, reload, recovery, shutdown, deadman, systemd.

A new verb goes in `requests/`, a new watcher in `watch/`, a new keeper message in
`running/` (and `supervisor/keeper/`).
"""
