"""Running: the processes of running jobs, reached through their keepers.

It starts the keepers and speaks their wire (`keepers.py`, `keeper_wire.py`,
`keeper_processes.py`), carries out the engine's Spawn and Kill actions (`runner.py`, with
`handles.py` for one running attempt and `ahead.py` for starts held back), and owns what a
job's processes are given: OOM scores (`oom_scores.py`) and the environment and command of a
launch (`launch.py`); the cgroup files it writes through `daemon/cgroups.py`, the output files'
paths come from `store/output_files.py`. It reports what happened to the engine as commands;
it never writes the store itself. Other rooms see it through the runner's public methods only.
"""
