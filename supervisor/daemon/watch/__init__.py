"""Watch: what the daemon observes and reports, without owning any job.

Host memory and per-job RSS (`memory.py`, `own_cgroup.py`, the periodic `sampling.py`), the
GPUs (`gpu_monitor.py`, `gpu_handover.py`), GPU hangs from the kernel log (`hangs.py`),
Prometheus metrics (`metrics.py`, `metrics_render.py`) and the operators' hooks (`hooks.py`).
What it sees that changes a job (a hang, a squeeze, a stalled job) goes to the engine as a
command; it never writes the store and never signals a process itself.
"""
