# The focused guest suite, what `scripts/test` runs (`scripts/vm-host.sh --suite focused`): on
# the unified cgroup v2 hierarchy with rootful Docker, the doctor, the outcomes (OOM with its
# evidence, a timeout, a signal), usage, a session's state, timeout and OOM recovery, one
# gVisor case; then a smoke through Podman's Docker-compatible API and through rootless
# Docker; nothing left on any of them.
. /payload/hosts/lib.sh
rootful
nothing_left rootful
# One daemon at a time here: beside the host's suites in CI the guest gets a fraction of a
# core, and both at once pushed Podman's doctor probe past its 30 s limit (the whole suite,
# run alone, takes them at once).
other_daemons smoke podman
other_daemons smoke rootless
finish
