#!/bin/sh
# PID 1 of the cgroup v2 test VM, baked into the cached root (scripts/test-v2.sh): mount
# the per-run share (virtiofs tag lfrun) and hand over to its guest-init.sh, so changing
# the test procedure never needs a root rebuild.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
if mount -t virtiofs lfrun /mnt/lazyfork-v2 && [ -f /mnt/lazyfork-v2/guest-init.sh ]; then
	exec /bin/sh /mnt/lazyfork-v2/guest-init.sh
fi
echo "lazyfork-v2-init: cannot mount the run share (virtiofs tag lfrun)" >/dev/console
echo o >/proc/sysrq-trigger
sleep 10
