# Test hosts on one machine, for tests that source this file (bash, root).
#
#   hosts_up N        N hosts: network namespaces $FXH_PREFIX-h1..hN, each
#                     with a veth end fx0 at 10.77.0.I/24, the other ends on
#                     a bridge in a further namespace ($FXH_PREFIX-br), so
#                     the machine's own namespace gets no interface, route
#                     or address; names resolve through /etc/netns/HOST/hosts
#   hosts_down        ends every process inside those namespaces (by PID,
#                     from `ip netns pids`), deletes the namespaces (their
#                     links and qdiscs with them) and the hosts files;
#                     installed as an EXIT trap by hosts_up, safe to repeat
#   hosts_mpirun LIST OPTS...  mpirun started in the first host (LIST as
#                     in --host: "HOST:SLOTS,..."), daemons on the others
#                     through agent.sh, TCP only and only on the test subnet,
#                     the runtime's TCP keepalive at 3 s + 3 x 1 s (so that
#                     a cut link ends the job in seconds, not after Linux's
#                     default of 300 s + 9 x 75 s), under `timeout -k`
#                     (FXH_MPIRUN: the mpirun binary)
#   link_bytes HOST   "rx tx" byte counters of HOST's fx0
#
# Traffic can only flow between these namespaces: the subnet exists nowhere
# else, and the bridge is not connected to the machine's network.
FXH_SUBNET=10.77.0.0/24
FXH_PREFIX=${FXH_PREFIX:-fxa$$}
FXH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FXH_HOSTS=()

fxh_host() { echo "$FXH_PREFIX-h$1"; }

hosts_down() {
    local ns pids
    for ns in "${FXH_HOSTS[@]}" "$FXH_PREFIX-br"; do
        ip netns list 2>/dev/null | grep -qw "^$ns" || continue
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill $pids 2>/dev/null && sleep 0.5
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    FXH_HOSTS=()
    return 0
}

hosts_up() {
    local n=$1 i j br
    br="$FXH_PREFIX-br"
    trap 'hosts_down' EXIT
    trap 'exit 130' INT TERM
    ip netns add "$br" || return 1
    ip -n "$br" link add br0 type bridge && ip -n "$br" link set br0 up || return 1
    for ((i = 1; i <= n; i++)); do
        local h
        h=$(fxh_host "$i")
        ip netns add "$h" || return 1
        FXH_HOSTS+=("$h")
        ip -n "$br" link add "v$i" type veth peer name fx0 netns "$h" || return 1
        ip -n "$br" link set "v$i" master br0 up || return 1
        ip -n "$h" addr add "10.77.0.$i/24" dev fx0 || return 1
        ip -n "$h" link set fx0 up && ip -n "$h" link set lo up || return 1
    done
    for ((i = 1; i <= n; i++)); do
        h=$(fxh_host "$i")
        mkdir -p "/etc/netns/$h"
        {
            echo "127.0.0.1 localhost"
            for ((j = 1; j <= n; j++)); do echo "10.77.0.$j $(fxh_host "$j")"; done
        } >"/etc/netns/$h/hosts"
    done
}

# hosts_mpirun "h1:2,h2:2" ARGS...: mpirun inside host 1, ranks as listed,
# within FXH_TIMEOUT seconds (default 120; timeout -k, so a hang fails).
hosts_mpirun() {
    local list=$1
    shift
    timeout -k 10 "${FXH_TIMEOUT:-120}" ip netns exec "$(fxh_host 1)" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
        "$(fxh_host 1)" "$FXH_MPIRUN" --allow-run-as-root --oversubscribe --bind-to none \
        --host "$list" --mca plm_rsh_agent "$FXH_HERE/agent.sh" \
        --mca pml ob1 --mca btl tcp,self --mca osc ^ucx \
        --mca btl_tcp_if_include "$FXH_SUBNET" --mca oob_tcp_if_include "$FXH_SUBNET" \
        --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1 \
        --mca oob_tcp_keepalive_probes 3 "$@"
}

link_bytes() {
    ip -n "$1" -s link show fx0 | awk '/RX:/ { getline; rx = $1 } /TX:/ { getline; tx = $1 }
        END { print rx, tx }'
}
