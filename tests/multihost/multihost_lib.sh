# shellcheck shell=bash
# The common start and end of the multihost test scripts (bash), which are
# called as SCRIPT MPIRUN FXATTN NPY_CLOSE and source this file first:
#   . "$(dirname "$0")/multihost_lib.sh"
# Without root it exits 77 (CTest: skipped): the test hosts are network
# namespaces. Otherwise it sets `set -u`, sources hosts.sh and sets
#   FXH_MPIRUN, fxattn, npy_close   the arguments (hosts_mpirun runs FXH_MPIRUN)
#   here              this folder
#   dir               a temporary folder
#   fail, bad MSG     the verdict: bad prints "FAIL: MSG" and sets fail=1
#   hosts_test_up N   N test hosts (hosts_up); they and $dir are removed on
#                     exit; failing to make them ends the test
#   hosts_test_end    removes them now, checks that no namespace or hosts
#                     file of the test is left, and exits with the verdict
# shellcheck disable=SC2034 # variables for the scripts that source this file
set -u
if [ "$(id -u)" -ne 0 ]; then
    echo "$(basename "$0"): network namespaces need root: skipped"
    exit 77
fi
export FXH_MPIRUN=$1
fxattn=$2
npy_close=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/multihost/hosts.sh
source "$here/hosts.sh"
dir=$(mktemp -d)
fail=0
bad() { echo "FAIL: $*"; fail=1; }
hosts_test_finish() {
    hosts_down
    rm -rf "$dir"
}
hosts_test_up() {
    hosts_up "$1" || { echo "FAIL: cannot make the test hosts"; hosts_test_finish; exit 1; }
    trap hosts_test_finish EXIT
}
hosts_test_end() {
    local prefix=$FXH_PREFIX left
    hosts_test_finish
    trap - EXIT
    left=$(ip netns list | grep -c "^$prefix-")
    [ "$left" -eq 0 ] || bad "$left test namespaces left behind"
    ls -d /etc/netns/"$prefix"-* >/dev/null 2>&1 && bad "hosts files left in /etc/netns"
    exit $fail
}
