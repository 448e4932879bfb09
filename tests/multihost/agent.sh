#!/usr/bin/env bash
# Open MPI's launcher agent for the test hosts (instead of ssh): Open MPI
# runs `agent.sh [ssh options] HOST COMMAND...` to start its daemon on HOST.
# HOST is a network namespace made by hosts.sh; the command runs there with
# its own hostname (unshare --uts, so Open MPI sees distinct nodes) and a
# cleared environment, as a login through sshd would give.
set -eu
while [ $# -gt 0 ]; do
    case "$1" in
    -o | -l | -p | -i) shift 2 ;; # ssh options with a value
    -*) shift ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "agent.sh: usage: agent.sh [options] HOST COMMAND..." >&2; exit 2; }
host=$1
shift
exec ip netns exec "$host" unshare --uts /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
    HOME="${HOME:-/root}" sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
