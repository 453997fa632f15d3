#!/usr/bin/env bash
# A cgroup v2 test host in a virtual machine: a Debian bookworm guest (debootstrap, Debian's
# own kernel and initrd) booted with QEMU, the unified cgroup v2 hierarchy, Docker, rootless
# Docker's and Podman's packages from Debian inside. codebox and a guest suite are copied in on
# a second disk for each run; the guest runs it from a oneshot unit, prints its output and its
# exit status on the serial console and powers off.
#
#   scripts/vm-host.sh [--suite NAME]   run tests/hosts/NAME.sh in the guest (default: focused)
#   scripts/vm-host.sh --run 'CMD'      run one shell command in the guest (codebox on PATH)
#   scripts/vm-host.sh --prepare        make (or check) the cached guest and its images, no run
#   scripts/vm-host.sh --clean          remove the cached guest
#
# The guest's disk is made once and cached outside the checkout, in $CODEBOX_VM_CACHE
# (default /var/cache/codebox-vm), keyed by a hash of what went into it (this script's
# guest recipe, the package list, the ids of the images loaded into it); each run boots a
# throwaway copy-on-write overlay of it, so runs never see each other's state.
# It never touches the host's cgroups, network or Docker: QEMU runs with `-nic none`, as a
# plain process (under `nice -n 10`, so that other work on the host's cores goes on), and
# the host's Docker is only read (`docker save` of the guest's images).
# Exit status: the guest command's own; 3 when the guest could not be made or did not boot
# (the reason is printed), 4 when it did not finish in time.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${CODEBOX_VM_CACHE:-/var/cache/codebox-vm}
suite=focused
command=
print_key=
bootstrap_only=
prepare_only=
timeout_s=${CODEBOX_VM_TIMEOUT:-3600}
while [ $# -gt 0 ]; do
  case "$1" in
    --clean) rm -rf "$cache"; echo "vm-host: removed $cache"; exit 0 ;;
    --suite) suite=$2; shift 2 ;;
    --run) command=$2; shift 2 ;;
    --print-key) print_key=1; shift ;;
    --bootstrap-only) bootstrap_only=1; shift ;;
    --prepare) prepare_only=1; shift ;;
    *) echo "usage: $0 [--clean] [--suite NAME] [--run CMD]" >&2; exit 2 ;;
  esac
done

die() { echo "vm-host: the guest cannot be used: $*" >&2; exit 3; }
say() { echo "vm-host: $* ($(( $(date +%s) - t0 )) s)"; }
t0=$(date +%s)

# Debian's packages for the guest: the host tools, then the guest's own list.
host_tools_missing() {
  missing=()
  command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
  command -v qemu-img >/dev/null 2>&1 || missing+=(qemu-utils)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
  [ ${#missing[@]} -gt 0 ]
}
# Twice: installing one may remove another (a newer qemu-utils from backports conflicts
# with Debian's qemu-system-x86, and apt removes it: seen on a fresh machine).
for try in 1 2; do
  host_tools_missing || break
  echo "vm-host: installing ${missing[*]} from Debian" >&2
  [ "$try" = 2 ] || DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "could not install ${missing[*]} (apt-get failed)"
done
host_tools_missing && die "still missing after installing them: ${missing[*]}"
packages=systemd-sysv,udev,kmod,iproute2,docker.io,linux-image-amd64,procps,apparmor,python3,jq,dbus
packages+=,rootlesskit,uidmap,dbus-user-session,slirp4netns,podman,crun,runsc,catatonit,e2fsprogs,ca-certificates
# The images the guest's daemons get, loaded once into the cached images layer, into every
# daemon (rootful Docker, Podman, rootless Docker): those of the whole suite's ten languages
# (bash's image has bash, awk, sql and jq; classic has forth, rexx, icon and algol68).
# docker load under emulation is slow: keep them few and small.
images=(codebox/base:bookworm codebox/bash:5.2 codebox/lua:5.4 codebox/tcl:8.6 codebox/classic:bookworm)
image_id() {
  docker image inspect --format '{{.Id}}' "$1" 2>/dev/null ||
    die "image $1 is not on the host's Docker: build it with \`codebox images build ${1#codebox/}\`"
}

# Cached stages, each keyed by what went into it, so that a change costs only the stages
# after it: the debootstrap tree (the packages), the guest's disk (the recipe, everything from
# `recipe_begin` to `recipe_end`), and a copy-on-write layer with the images loaded into the
# daemons (their ids, the layer recipe and tests/hosts/daemon.sh).
recipe=$(sed -n '/^# recipe_begin/,/^# recipe_end/p' "$0")
layer_recipe=$(sed -n '/^# layer_begin/,/^# layer_end/p' "$0"; cat "$here/tests/hosts/daemon.sh")
pkey=$(printf '%s\n' "$packages" | sha256sum | cut -c1-16)
key=$(printf '%s\n' "$packages" "$recipe" | sha256sum | cut -c1-16)
dir=$cache/$key
if [ -n "$print_key" ]; then echo "$dir"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9   # one maker/runner of the guest at a time on this host

# recipe_begin
write_guest_files() { # $1: the guest's root
  local r=$1
  echo codebox-guest > "$r/etc/hostname"
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' > "$r/etc/fstab"
  # The serial console carries the suite's output: no login prompt, no timers.
  for u in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer apt-daily-upgrade.timer \
           e2scrub_all.timer fstrim.timer man-db.timer systemd-timesyncd.service \
           podman-auto-update.timer podman-restart.service; do
    ln -sf /dev/null "$r/etc/systemd/system/$u"
  done
  # A user for rootless Docker, with subordinate ids.
  chroot "$r" useradd -m -u 1000 -s /bin/bash rootless 2>/dev/null || true
  echo 'rootless:100000:65536' > "$r/etc/subuid"
  echo 'rootless:100000:65536' > "$r/etc/subgid"
  # Delegate every controller to user sessions (systemd delegates only memory and pids by
  # default): rootless daemons can then apply --cpus and --memory.
  mkdir -p "$r/etc/systemd/system/user@.service.d"
  printf '[Service]\nDelegate=cpu cpuset io memory pids\n' \
    > "$r/etc/systemd/system/user@.service.d/delegate.conf"
  cat > "$r/usr/local/sbin/codebox-guest" <<'EOF'
#!/bin/bash
# Runs /payload/run.sh from the second disk, its output and exit status on the serial console.
exec > /dev/ttyS0 2>&1
echo "CODEBOX-GUEST-UP uptime=$(cut -d' ' -f1 /proc/uptime)"
mkdir -p /payload
rc=0
if mount -o ro /dev/vdb /payload; then
  export PATH=/payload/bin:$PATH CODEBOX_LANGUAGES=/payload/languages.toml HOME=/root
  cd /root && bash /payload/run.sh || rc=$?
else
  echo "codebox-guest: no payload disk"; rc=3
fi
sync
echo "CODEBOX-GUEST-RC=$rc"
systemctl --no-block poweroff
EOF
  chmod 755 "$r/usr/local/sbin/codebox-guest"
  cat > "$r/etc/systemd/system/codebox-guest.service" <<'EOF'
[Unit]
Description=codebox guest suite
After=docker.service local-fs.target
Wants=docker.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/codebox-guest
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
  ln -sf /etc/systemd/system/codebox-guest.service \
    "$r/etc/systemd/system/multi-user.target.wants/codebox-guest.service"
  # Podman's Docker-compatible API on a socket (started only by the suites that use it).
  rm -f "$r/etc/systemd/system/sockets.target.wants/podman.socket"
}
# The guest's disk: the tree and each daemon's copy of the images.
disk_size=12G
# recipe_end
qemu_boot() { # $1: disk (raw or qcow2), $2: payload disk, $3: serial log
  local fmt=raw
  case "$1" in *.qcow2) fmt=qcow2 ;; esac
  local accel=(-accel tcg,thread=multi)
  if [ "${CODEBOX_VM_KVM:-0}" = 1 ] && [ -w /dev/kvm ]; then accel=(-accel kvm); fi
  # In the background, so that a vm-host.sh that is stopped takes its QEMU with it.
  timeout --kill-after=10 "$timeout_s" nice -n 10 qemu-system-x86_64 "${accel[@]}" -smp 2 -m 4096 \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 quiet loglevel=3 systemd.show_status=false systemd.unified_cgroup_hierarchy=1 apparmor=1 security=apparmor" \
    -drive "file=$1,format=$fmt,if=virtio" -drive "file=$2,format=raw,if=virtio,readonly=on" \
    -display none -serial "file:$3" -monitor none -nic none -no-reboot &
  qemu_pid=$!
  local rc=0
  wait "$qemu_pid" || rc=$?
  qemu_pid=
  return "$rc"
}
qemu_pid=
stop_qemu() { [ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true; }
trap 'stop_qemu; exit 130' INT TERM HUP

make_payload() { # $1: dir with run.sh etc., $2: image file
  local size
  size=$(( $(du -sm "$1" | cut -f1) + 64 ))
  rm -f "$2"
  mkfs.ext4 -q -F -L payload -d "$1" "$2" "${size}M" || die "mkfs.ext4 of the payload failed"
}

# Stage 1: the debootstrap tree, kept so that a recipe change costs a mkfs, not a debootstrap.
root=$cache/root-$pkey
if [ ! -e "$root.done" ]; then
  rm -rf "$root"
  say "debootstrap of the guest's packages into $root (from Debian's mirror)"
  # debootstrap's resolver does not follow every alternative (a package left unconfigured
  # is re-tried by apt below); what matters is that dpkg ends with nothing half-installed.
  debootstrap --variant=minbase --include="$packages" bookworm "$root" http://deb.debian.org/debian \
    > "$root.log" 2>&1 || echo "vm-host: debootstrap: $(tail -n 1 "$root.log")"
  [ -x "$root/usr/bin/apt-get" ] || die "debootstrap failed: $(tail -n 3 "$root.log")"
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -f install -y -qq >> "$root.log" 2>&1 || true
  [ -z "$(chroot "$root" dpkg --audit)" ] ||
    die "packages left unconfigured in the guest: $(chroot "$root" dpkg --audit | head -n 5)"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  touch "$root.done"
  say "debootstrap done"
fi
if [ -n "$bootstrap_only" ]; then exit 0; fi

# Stage 2: the guest's disk, made from a copy of the tree with the recipe's files.
if [ ! -e "$dir/ready" ]; then
  rm -rf "$dir"; mkdir -p "$dir"
  tree=$dir/root
  cp -a "$root" "$tree"
  write_guest_files "$tree"
  cp "$(ls "$tree"/boot/vmlinuz-* | sort -V | tail -n 1)" "$dir/vmlinuz"
  cp "$(ls "$tree"/boot/initrd.img-* | sort -V | tail -n 1)" "$dir/initrd.img" ||
    die "the guest has no initrd in /boot"
  mkfs.ext4 -q -F -L root -d "$tree" "$dir/disk.img" "$disk_size" || die "mkfs.ext4 of the guest's disk failed"
  rm -rf "$tree"
  touch "$dir/ready"
  say "disk made"
  # Guests of other recipes and trees of other package lists are of no more use.
  for old in "$cache"/*; do
    case "$old" in "$dir"|"$root"|"$root.done"|"$root.log"|"$cache/lock"|"$cache/last-console.log") ;; *) rm -rf "$old" ;; esac
  done
fi

# layer_begin
# The prepare boot's script: load the images given on the payload into the daemons it names
# (all at once: each load is mostly one CPU's work, the guest has two), from images.tar.
prepare_script() { # $@: daemons (rootful podman rootless)
  cat <<'EOF'
set -e
for i in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 1; done
echo "docker up at uptime $(cut -d' ' -f1 /proc/uptime)"
load() { # $1: daemon
  local host= t; t=$(date +%s)
  [ "$1" = rootful ] || host=$(bash /payload/daemon.sh start "$1") || { echo "$1: the daemon did not start"; return 1; }
  DOCKER_HOST=$host docker load -q -i /payload/images.tar >/dev/null || { echo "$1: docker load failed"; return 1; }
  echo "docker load into $1 took $(( $(date +%s) - t )) s"
  DOCKER_HOST=$host docker info --format "$1: cgroup {{.CgroupVersion}} driver {{.CgroupDriver}} security {{.SecurityOptions}}"
  [ "$1" = rootful ] || bash /payload/daemon.sh stop "$1"
}
pids=()
EOF
  local d
  for d in "$@"; do echo "load $d & pids+=(\$!)"; done
  echo 'rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; sync; exit $rc'
}
# layer_end

# Stage 3: a boot that loads the images into the daemons, kept as a copy-on-write layer.
ids=(); for i in "${images[@]}"; do ids+=("$(image_id "$i")"); done
ikey=$(printf '%s\n' "${ids[@]}" "$layer_recipe" | sha256sum | cut -c1-16)
layer=$dir/images-$ikey.qcow2
if [ ! -e "$layer.ready" ]; then
  rm -f "$layer"
  qemu-img create -q -f qcow2 -b "$dir/disk.img" -F raw "$layer" || die "qemu-img failed"
  p=$dir/prepare; rm -rf "$p"; mkdir -p "$p"
  docker save "${images[@]}" -o "$p/images.tar" || die "docker save of ${images[*]} failed"
  prepare_script rootful podman rootless > "$p/run.sh"
  cp "$here/tests/hosts/daemon.sh" "$p/daemon.sh"
  make_payload "$p" "$dir/prepare.img"; rm -rf "$p"
  say "a boot to load ${images[*]} into the guest's Docker, Podman and rootless Docker"
  qemu_boot "$layer" "$dir/prepare.img" "$dir/prepare.log" ||
    die "QEMU failed or timed out on the boot that loads the images (status $?); its console: $(tail -n 20 "$dir/prepare.log")"
  rm -f "$dir/prepare.img"
  grep -E 'CODEBOX-GUEST-UP|docker up|docker load|cgroup|did not|failed' "$dir/prepare.log" | sed 's/^/vm-host: guest: /'
  grep -q '^CODEBOX-GUEST-RC=0' "$dir/prepare.log" ||
    die "the boot that loads the images failed; its console: $(tail -n 30 "$dir/prepare.log")"
  touch "$layer.ready"
  # Only now are layers of other images of no more use (a boot that failed kept them).
  for old in "$dir"/images-*; do
    case "$old" in "$layer"|"$layer.ready") ;; *) rm -f "$old" ;; esac
  done
  say "guest $key with images $ikey ready"
fi

if [ -n "$prepare_only" ]; then say "the guest is ready"; exit 0; fi

# This run: codebox, the registry and the suite on a payload disk; an overlay of the disk.
run=$(mktemp -d "$cache/run.XXXXXX")
trap 'stop_qemu; rm -rf "$run"' EXIT
mkdir -p "$run/payload/bin"
bin=${CODEBOX_BIN:-$here/target/debug/codebox}
[ -x "$bin" ] || die "no codebox binary at $bin (cargo build first)"
objcopy --strip-debug "$bin" "$run/payload/bin/codebox" 2>/dev/null || cp "$bin" "$run/payload/bin/codebox"
cp "$here/languages.toml" "$run/payload/languages.toml"
cp -r "$here/tests/hosts" "$run/payload/hosts"
if [ -n "$command" ]; then
  printf 'for i in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 1; done\n%s\n' "$command" > "$run/payload/run.sh"
else
  [ -f "$here/tests/hosts/$suite.sh" ] || { echo "vm-host: no suite tests/hosts/$suite.sh" >&2; exit 2; }
  echo "exec bash /payload/hosts/$suite.sh" > "$run/payload/run.sh"
fi
make_payload "$run/payload" "$run/payload.img"
qemu-img create -q -f qcow2 -b "$layer" -F qcow2 "$run/overlay.qcow2" || die "qemu-img failed"
say "booting the guest"
log=$run/console.log
: > "$log"
tail -n +1 -f "$log" --pid=$$ 2>/dev/null | sed -u -n '/CODEBOX-GUEST-UP/,$p' &
tailer=$!
boot_start=$(date +%s)
qrc=0
qemu_boot "$run/overlay.qcow2" "$run/payload.img" "$log" || qrc=$?
sleep 1; kill "$tailer" 2>/dev/null || true; wait "$tailer" 2>/dev/null || true
cp "$log" "$cache/last-console.log"
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "vm-host: the guest did not finish within ${timeout_s} s (CODEBOX_VM_TIMEOUT); console in $cache/last-console.log" >&2
  exit 4
fi
grep -q CODEBOX-GUEST-UP "$log" ||
  die "the guest did not boot (QEMU status $qrc); its console: $(tail -n 30 "$log")"
rc=$(sed -n 's/^CODEBOX-GUEST-RC=\([0-9]*\).*/\1/p' "$log" | tail -n 1)
[ -n "$rc" ] || die "the guest stopped without reporting a status (QEMU status $qrc); console in $cache/last-console.log"
say "guest finished with status $rc (QEMU ran $(( $(date +%s) - boot_start )) s)"
exit "$rc"
