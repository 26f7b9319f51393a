#!/usr/bin/env bash
# Run a command, and everything it starts, on a share of this machine's CPU: a slower VM, for checking
# that the test tiers' clocks hold where CI lands on one (the 2-core VMs differ up to 2x in speed).
#   sudo bench/cpu_quota.sh 125 make test-live    # 1.25 of the 2 cores: a VM about 1.6x slower
# A CFS quota of PERCENT % of one core (cgroup v2 cpu.max, or cgroup v1's cpu controller); needs root.
set -euo pipefail
percent=${1:?usage: bench/cpu_quota.sh PERCENT COMMAND...}
shift
[[ $percent =~ ^[0-9]+$ && $percent -ge 10 ]] || { echo "PERCENT: a whole number >= 10, got '$percent'" >&2; exit 2; }
period=100000
quota=$((percent * period / 100))
name="taxiway-quota-$$"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then  # cgroup v2
    group=/sys/fs/cgroup/$name
    mkdir "$group"
    echo "$quota $period" > "$group/cpu.max"
else  # cgroup v1
    group=/sys/fs/cgroup/cpu/$name
    mkdir "$group"
    echo "$period" > "$group/cpu.cfs_period_us"
    echo "$quota" > "$group/cpu.cfs_quota_us"
fi
# the group goes once its last process has: the tests' services stop a few seconds after pytest exits
release() {
    for _ in $(seq 60); do rmdir "$group" 2>/dev/null && return; sleep 1; done
    echo "$group: still holds processes after 60 s; remove it when they end" >&2
}
trap release EXIT
echo "$(date -u +%FT%TZ) on ${percent}% of one core ($(nproc) cores): $*" >&2
status=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' quota "$group" "$@" || status=$?
exit "$status"
