#!/bin/bash
# PID 1's prelude inside fresh pid, mount, uts and cgroup namespaces: a private machine
# whose writes land in overlays under $1 (nothing reaches the host's /etc, /var, /opt,
# /dev, /run or /tmp), then systemd itself as PID 1. Run by machine.py, never by hand.
set -euo pipefail
work=$1
mount --make-rprivate /
hostname gpusv-host
# A network of its own: loopback, and one address besides (getaddrinfo's AI_ADDRCONFIG,
# which Slurm uses, resolves no IPv4 address, not even 127.0.0.1, without one).
ip link set lo up
if ip link add gpusv0 type veth peer name gpusv1; then
    ip addr add 10.251.0.1/24 dev gpusv0
    ip link set gpusv0 up
    ip link set gpusv1 up
fi
mount -t proc -o nosuid,nodev,noexec proc /proc
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount --rbind /sys /sys
mount -o remount,bind,ro /sys
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
# The work dir may itself lie under /var or /tmp: reach it through /mnt from here on.
mount --bind "$work" /mnt
work=/mnt
for dir in etc var opt; do
    mkdir -p "$work/$dir.up" "$work/$dir.work"
    mount -t overlay overlay -o "lowerdir=/$dir,upperdir=$work/$dir.up,workdir=$work/$dir.work" "/$dir"
done
mount -t tmpfs -o nosuid,mode=755 dev /dev
mknod -m 666 /dev/null c 1 3
mknod -m 666 /dev/zero c 1 5
mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8
mknod -m 666 /dev/urandom c 1 9
mknod -m 666 /dev/tty c 5 0
ln -s /dev/null /dev/console
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mkdir /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o nosuid,nodev,mode=1777 shm /dev/shm
mount -t tmpfs -o nosuid,nodev,mode=755 run /run
mount -t tmpfs -o nosuid,nodev,mode=1777 tmp /tmp
# What a boot would do to a shared machine, or cannot do in a namespace: never started.
for unit in $(grep -v "^#" "$work/masked"); do
    ln -sf /dev/null "/etc/systemd/system/$unit"
done
exec /lib/systemd/systemd --system --unit=basic.target
