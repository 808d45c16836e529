#!/usr/bin/env bash
# The mutation score of the pure core (supervisor/core/), the kernel-log classifier and
# the engine's glue around the store (daemon/engine.py, store/commit.py, life/recovery.py):
# mutmut changes one thing at a time in that code (a comparison, a constant, a branch)
# and runs the unit tests that reach it; a mutant that no test notices "survived".
#
#   scripts/mutation.sh                      # fresh run of everything, then the report
#   scripts/mutation.sh 'supervisor.daemon.*'  # fresh run of the mutants of those names
#   scripts/mutation.sh --report             # only the report of the last run
#
# Environment: MUTATION_JOBS (parallel children, default 2).
# What is mutated and which tests run are in pyproject.toml, [tool.mutmut]; the report
# is printed and written to mutants/report.txt. See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]' 'mutmut>=3.3,<4'

if [[ "${1:-}" != "--report" ]]; then
    rm -rf mutants
    # mutmut redraws a progress line many times a second; keep only its last state.
    .venv/bin/mutmut run --max-children "${MUTATION_JOBS:-2}" "$@" | tr '\r' '\n' | tail -n 3
fi

.venv/bin/mutmut results --all true > mutants/results.txt
.venv/bin/python - <<'EOF' | tee mutants/report.txt
"""Tally mutmut's verdicts per module, and list what was not killed."""
import collections
import re

KILLED = {"killed", "timeout", "caught by type check"}
UNRUN = {"skipped", "not checked"}  # "not checked": left out by a run of some names only
verdicts = collections.defaultdict(collections.Counter)
left = collections.defaultdict(list)
for line in open("mutants/results.txt"):
    m = re.match(r"\s*([\w.]+?)\.x[_\w]*?__mutmut_\d+: (.+)$", line.rstrip())
    if not m:
        m = re.match(r"\s*([\w.]+?)\.x[ǁ\w]*?__mutmut_\d+: (.+)$", line.rstrip())
    if not m:
        continue
    module, verdict = m.group(1), m.group(2).strip()
    verdicts[module][verdict] += 1
    if verdict not in KILLED | UNRUN:
        left[module].append((line.split(":")[0].strip(), verdict))

def score(counts):
    tested = sum(n for v, n in counts.items() if v not in UNRUN)
    killed = sum(n for v, n in counts.items() if v in KILLED)
    return killed, tested

print(f"{'module':40} {'killed':>7} {'of':>5} {'score':>7}")
groups = {name: collections.Counter() for name in ("core", "classifier", "daemon")}
for module in sorted(verdicts):
    killed, tested = score(verdicts[module])
    if not tested:  # none of its mutants was run
        continue
    print(f"{module:40} {killed:7} {tested:5} {100 * killed / max(tested, 1):6.1f}%")
    group = next(g for g in ("core", "classifier", "daemon") if f".{g}" in module)
    groups[group].update(verdicts[module])
for name, counts in groups.items():
    killed, tested = score(counts)
    if not tested:
        continue
    print(f"TOTAL {name:34} {killed:7} {tested:5} {100 * killed / max(tested, 1):6.1f}%")
print()
print("not killed (mutmut show NAME prints the change):")
for module in sorted(left):
    for name, verdict in left[module]:
        print(f"  {verdict:12} {name}")
EOF
