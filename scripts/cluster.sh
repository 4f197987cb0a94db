#!/usr/bin/env bash
# A cluster in one machine: network namespaces as nodes, veth pairs as NICs, one bridge per
# rail (NIC index) in a "switch" namespace, `htb` giving every NIC a rate in both directions.
#
#   scripts/cluster.sh up --nodes N --nics K --rate 200mbit [--burst 32k] [--cc cubic]
#   scripts/cluster.sh run [--ranks-per-node M] [--timeout S] [--mpi] [--pin] [--keep-logs] -- CMD ARGS...
#   scripts/cluster.sh exec NODE -- CMD ARGS...       one command inside node NODE
#   scripts/cluster.sh link NODE NIC up|down          take a NIC down (faults) or back up
#   scripts/cluster.sh partition A B cut|heal         cut every path between nodes A and B
#   scripts/cluster.sh rate NODE NIC RATE             reshape one NIC (8bit: a link that stalls)
#   scripts/cluster.sh counters                       bytes sent/received per node and NIC
#   scripts/cluster.sh profile [ALPHA_US] > F.toml    a tuning profile from R and K alone
#   scripts/cluster.sh status | down
#
# Layout (N nodes, K NICs each): node i is namespace NAME-n<i> with host name NAME-n<i>
# (each rank's own `unshare --uts`), NICs pn0..pn<K-1>; NIC k of node i has 10.77.k.<i+1>/24
# on bridge br<k> of namespace NAME-sw, whose own address there is 10.77.k.254 and which
# routes between rails. Each node sends what leaves from a NIC's address out of that NIC
# (source routing: one table per NIC), as multi-rail hosts are set up, so a rank bound to its
# NIC's address uses that NIC whatever rail its peer is on.
#
# Shaping (measured choices, docs/CLUSTER.md): `htb`, one class per peer address (u32 filter)
# under a class of the NIC's rate, burst 32 KiB, on the node's side of each veth (what the
# node sends) and on the switch's side (what it receives); GSO stays on. Every route of a node
# carries a TCP congestion control (`--cc`, default cubic; `--cc default`: the host's), so
# every TCP connection between nodes uses it, PCCL's and MPI's alike: BBR, this host's
# default, misreads the htb burst and stalls connections that idle between turns
# (docs/CLUSTER.md, "Congestion control"), and namespaces cannot change the sysctl.
#
# `run` starts M ranks per node (rank = node * M + local), each with PCCL_RANK,
# PCCL_WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, PCCL_UNIQUE_ID_FILE (fresh per run),
# PCCL_TOPO_FILE (a topology of K NICs so the NIC map applies), and the run's CMD. Rank 0's
# output goes to the terminal, every rank's to STATE/run/rank<r>.log; the exit status is the
# first failing rank's. `--mpi` starts CMD under MPICH's mpiexec instead (hydra's ssh launcher
# pointed at a script that enters the node), with UCX on tcp. `--timeout` kills a run that
# outlives it (exit 124). `--pin` gives each node its own share of the host's cores (node i
# on core i mod C when there are at least as many nodes as cores C, else a contiguous range of
# C/N cores), as a real node owns its cores, also under `--mpi` (hydra's proxy on the node's
# cores); without it the scheduler moves every rank freely.
#
# Needs root, ip, tc, unshare; `up` says why and exits 77 where the machine does not allow it.
# `down` removes namespaces, veths, processes, /etc/netns entries and leaked /dev/shm rings,
# also after a crash. State: $PCCL_CLUSTER_DIR (default /run/pccl-cluster/NAME).
set -euo pipefail

NAME=${PCCL_CLUSTER_NAME:-pcc}
NET=10.77

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: cannot build the cluster here: $*" >&2; exit 77; }
state() { echo "${PCCL_CLUSTER_DIR:-/run/pccl-cluster/$NAME}"; }
load() {
    local s; s=$(state)
    [ -f "$s/config" ] || die "no cluster '$NAME' is up (scripts/cluster.sh up ...)"
    # shellcheck disable=SC1091
    . "$s/config"
}
ns_node() { echo "$NAME-n$1"; }
ns_sw() { echo "$NAME-sw"; }
sw_port() { echo "$NAME-s$1r$2"; }

# The rate in bit/s of a tc rate such as 200mbit, 1gbit, 500kbit.
rate_bits() {
    local r=${1,,}
    case $r in
        *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
        *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
        *kbit) echo $(( ${r%kbit} * 1000 )) ;;
        *bit) echo "${r%bit}" ;;
        *) die "--rate $1: expected a number with kbit, mbit or gbit" ;;
    esac
}

# A tc size (32k, 64kb, 1m, 1500b) in bytes: tc's k and m are 1024 and 1024².
size_bytes() {
    local r=${1,,}
    r=${r%b}
    case $r in
        *k) echo $(( ${r%k} * 1024 )) ;;
        *m) echo $(( ${r%m} * 1048576 )) ;;
        *[!0-9]* | '') die "--burst $1: expected a size such as 32k" ;;
        *) echo "$r" ;;
    esac
}

check_machine() {
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
    for c in ip tc unshare; do
        command -v "$c" >/dev/null || skip "no '$c' command"
    done
    local probe="$NAME-probe$$"
    ip netns add "$probe" 2>/dev/null || skip "ip netns add is not allowed"
    if ! ip -n "$probe" link add pccl-b0 type bridge 2>/dev/null; then
        ip netns del "$probe"; skip "no bridge support"
    fi
    if ! ip -n "$probe" link add pccl-v0 type veth peer name pccl-v1 2>/dev/null; then
        ip netns del "$probe"; skip "no veth support"
    fi
    ip -n "$probe" link set pccl-v0 up
    if ! tc -n "$probe" qdisc add dev pccl-v0 root handle 1: htb 2>/dev/null; then
        ip netns del "$probe"; skip "no htb qdisc"
    fi
    ip netns del "$probe"
}

# htb on DEV (in namespace NS): a class of RATE, under it one class per peer address
# (matched by MATCH: dst on the node's side, src on the switch's side).
shape() {
    local ns=$1 dev=$2 rate=$3 burst=$4 match=$5; shift 5
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 9
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" \
        burst "$burst" cburst "$burst" quantum 32768
    tc -n "$ns" class add dev "$dev" parent 1:1 classid 1:9 htb rate 1mbit ceil "$rate" \
        burst "$burst" cburst "$burst" quantum 32768 prio 1
    # Bare TCP ACKs (IP packets under 128 bytes) ahead of the bulk: a node that sends and
    # receives at once (every exchange of recursive doubling) would otherwise queue the ACKs
    # of what it receives behind what it sends, and slow its own receive (switches do not
    # hold an ACK behind megabytes of another flow).
    tc -n "$ns" class add dev "$dev" parent 1:1 classid 1:2 htb rate 1mbit ceil "$rate" \
        burst "$burst" cburst "$burst" quantum 32768 prio 0
    tc -n "$ns" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
        match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:2
    local n=10 a
    for a in "$@"; do
        tc -n "$ns" class add dev "$dev" parent 1:1 classid "1:$n" htb rate 1mbit ceil "$rate" \
            burst "$burst" cburst "$burst" quantum 32768 prio 1
        tc -n "$ns" filter add dev "$dev" parent 1: protocol ip prio 2 u32 \
            match ip "$match" "$a/32" flowid "1:$n"
        n=$((n + 1))
    done
}

topo_xml() { # K NICs pn0..pn<K-1>, one package each, for PCCL_TOPO_FILE
    local k=$1 i
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo '<!DOCTYPE topology SYSTEM "hwloc2.dtd">'
    echo '<topology version="2.0">'
    echo '  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">'
    echo "    <info name=\"DMIProductName\" value=\"emulated node, $k Ethernet NICs (scripts/cluster.sh)\"/>"
    echo '    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">'
    echo '      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="17179869184"/>'
    echo '      <object type="Core" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">'
    echo '        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>'
    echo '        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6"/>'
    echo '      </object>'
    for ((i = 0; i < k; i++)); do
        local g=$((10 + 4 * i)) bus
        bus=$(printf '%02x' $((i + 1)))
        echo "      <object type=\"Bridge\" gp_index=\"$g\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[$bus-$bus]\">"
        echo "        <object type=\"PCIDev\" gp_index=\"$((g + 1))\" pci_busid=\"0000:$bus:00.0\" pci_type=\"0200 [8086:1593] [8086:0000] 01\" pci_link_speed=\"31.507692\">"
        echo "          <object type=\"OSDev\" gp_index=\"$((g + 2))\" name=\"pn$i\" osdev_type=\"2\"/>"
        echo '        </object>'
        echo '      </object>'
    done
    echo '    </object>'
    echo '  </object>'
    echo '</topology>'
}

# The routes of NIC $2 of node $1: what leaves from the NIC's address leaves through the NIC
# (its own table), and the rail's subnet in the main table, each with the cluster's congestion
# control (CC) where it has one.
nic_routes() {
    local i=$1 k=$2 n addr cc=(); n=$(ns_node "$1"); addr="$NET.$k.$((i + 1))"
    [ -n "${CC:-}" ] && cc=(congctl "$CC")
    ip -n "$n" route replace "$NET.$k.0/24" dev "pn$k" src "$addr" table $((100 + k)) "${cc[@]}"
    ip -n "$n" route replace "$NET.0.0/16" via "$NET.$k.254" dev "pn$k" table $((100 + k)) "${cc[@]}"
    ip -n "$n" route replace "$NET.$k.0/24" dev "pn$k" proto kernel scope link src "$addr" "${cc[@]}"
}

cmd_up() {
    local nodes=2 nics=1 rate=200mbit burst=32k cc=cubic
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) nodes=$2; shift 2 ;;
            --nics) nics=$2; shift 2 ;;
            --rate) rate=$2; shift 2 ;;
            --burst) burst=$2; shift 2 ;;
            --cc) cc=$2; shift 2 ;;
            *) die "up: unknown option $1" ;;
        esac
    done
    [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] || die "--nodes $nodes: expected 1..64"
    [ "$nics" -ge 1 ] && [ "$nics" -le 8 ] || die "--nics $nics: expected 1..8"
    rate_bits "$rate" >/dev/null
    [ "$cc" = default ] && cc=""
    if [ -n "$cc" ] && ! grep -qw "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
        die "--cc $cc: the kernel offers $(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null || echo none) (--cc default: the host's)"
    fi
    check_machine
    local s; s=$(state)
    [ -f "$s/config" ] && cmd_down >/dev/null 2>&1 || true
    mkdir -p "$s"
    printf 'NODES=%s\nNICS=%s\nRATE=%s\nBURST=%s\nCC=%s\n' "$nodes" "$nics" "$rate" "$burst" "$cc" >"$s/config"
    CC=$cc
    topo_xml "$nics" >"$s/topo.xml"
    local sw i k; sw=$(ns_sw)
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip netns exec "$sw" sysctl -qw net.ipv4.ip_forward=1
    ip netns exec "$sw" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
    for ((k = 0; k < nics; k++)); do
        ip -n "$sw" link add "br$k" type bridge
        ip -n "$sw" addr add "$NET.$k.254/24" dev "br$k"
        ip -n "$sw" link set "br$k" up
    done
    local hosts="127.0.0.1 localhost"$'\n'
    for ((i = 0; i < nodes; i++)); do
        hosts+="$NET.0.$((i + 1)) $(ns_node "$i")"$'\n'
    done
    for n in "$sw" $(for ((i = 0; i < nodes; i++)); do ns_node "$i"; done); do
        mkdir -p "/etc/netns/$n"
        printf '%s' "$hosts" >"/etc/netns/$n/hosts"
    done
    for ((i = 0; i < nodes; i++)); do
        local n; n=$(ns_node "$i")
        ip netns add "$n"
        ip -n "$n" link set lo up
        ip netns exec "$n" sysctl -qw net.ipv4.conf.all.rp_filter=0 \
            net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.arp_ignore=1
        for ((k = 0; k < nics; k++)); do
            local port tmp addr; port=$(sw_port "$i" "$k"); tmp="$NAME-t$i-$k"
            addr="$NET.$k.$((i + 1))"
            ip link add "$tmp" type veth peer name "$port"
            ip link set "$tmp" netns "$n"
            ip -n "$n" link set "$tmp" name "pn$k"
            ip link set "$port" netns "$sw"
            ip -n "$sw" link set "$port" master "br$k"
            ip -n "$sw" link set "$port" up
            ip -n "$n" addr add "$addr/24" dev "pn$k"
            ip -n "$n" link set "pn$k" up
            ip netns exec "$n" sysctl -qw "net.ipv4.conf.pn$k.rp_filter=0"
            nic_routes "$i" "$k"
            ip -n "$n" rule add from "$addr" table $((100 + k)) priority $((100 + k))
        done
    done
    # Shaping, once every address exists.
    for ((i = 0; i < nodes; i++)); do
        local n peers=() j; n=$(ns_node "$i")
        for ((j = 0; j < nodes; j++)); do
            [ "$j" = "$i" ] && continue
            for ((k = 0; k < nics; k++)); do peers+=("$NET.$k.$((j + 1))"); done
        done
        for ((k = 0; k < nics; k++)); do
            shape "$n" "pn$k" "$rate" "$burst" dst "${peers[@]}"
            shape "$sw" "$(sw_port "$i" "$k")" "$rate" "$burst" src "${peers[@]}"
        done
    done
    date +%s >"$s/up_since"
    echo "cluster '$NAME' up: $nodes nodes x $nics NICs at $rate (burst $burst, TCP ${cc:-host default}); state in $s"
}

cmd_down() {
    local s; s=$(state)
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-(sw|n[0-9]+|probe[0-9]+)$" || true); do
        local pids; pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    # veths left in the root namespace by an `up` that died half way.
    local l
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$NAME-(t|s)[0-9]" || true); do
        ip link del "$l" 2>/dev/null || true
    done
    if [ -f "$s/pids" ]; then
        xargs -r kill -9 <"$s/pids" 2>/dev/null || true
    fi
    # Rings a crashed rank created but nobody mapped (mapped ones are unlinked at once).
    if [ -f "$s/up_since" ]; then
        local since f; since=$(cat "$s/up_since")
        for f in /dev/shm/pccl-*; do
            [ -e "$f" ] || continue
            [ "$(stat -c %Y "$f")" -ge "$since" ] || continue
            if ! find /proc/[0-9]*/fd -lname "$f" 2>/dev/null | grep -q .; then rm -f "$f"; fi
        done
    fi
    rm -rf "$s"
    echo "cluster '$NAME' down"
}

cmd_status() {
    load
    echo "cluster '$NAME': $NODES nodes x $NICS NICs at $RATE (burst $BURST, TCP ${CC:-host default})"
    ip netns list | grep -E "^$NAME-" || true
}

# A tuning profile written from the rate, the NICs per node and the topology alone (nothing
# measured): each NIC moves TCP payload at R x 1448/1514 (a 1500-byte MTU frame's share of
# payload), the latency of a message between nodes is assumed, the rest is PCCL's defaults.
cmd_profile() {
    load
    local alpha=${1:-50}
    local bits gbps burst
    bits=$(rate_bits "$RATE")
    gbps=$(awk -v b="$bits" 'BEGIN { printf "%.6f", b / 8e9 * 1448 / 1514 }')
    burst=$(size_bytes "${BURST:-32k}")
    cat <<EOF
# PCCL tuning profile of the emulated cluster '$NAME' ($NODES nodes x $NICS NICs at $RATE),
# written by scripts/cluster.sh profile from the rate, the NIC count and the topology alone.
name = "cluster-${NICS}nic-$RATE"
source = "scripts/cluster.sh profile: NIC rate $RATE x 1448/1514 (TCP payload per 1500-byte frame), $NICS NICs per node, the shaper's burst ${BURST:-32k}, latency ${alpha} us assumed"
efficiency = 1.0

[inter]
# A TCP message through two veths, a bridge and the switch's routing on one host: assumed.
alpha_us = $alpha
nics = $NICS
nic_bandwidth_gbps = $gbps
taper = 1.0
# The first bytes after an idle spell pass each NIC direction at once (htb's burst).
burst_bytes = $burst
EOF
}

cmd_counters() {
    load
    local i k
    printf '%-8s %-4s %14s %14s\n' node nic tx_bytes rx_bytes
    for ((i = 0; i < NODES; i++)); do
        for ((k = 0; k < NICS; k++)); do
            printf '%-8s %-4s %14s %14s\n' "$i" "pn$k" \
                "$(ip netns exec "$(ns_node "$i")" cat "/sys/class/net/pn$k/statistics/tx_bytes")" \
                "$(ip netns exec "$(ns_node "$i")" cat "/sys/class/net/pn$k/statistics/rx_bytes")"
        done
    done
}

cmd_link() {
    load
    [ $# -eq 3 ] || die "link NODE NIC up|down"
    local i=$1 k=$2 how=$3
    [ "$how" = up ] || [ "$how" = down ] || die "link: expected up or down, not $how"
    ip -n "$(ns_node "$i")" link set "pn$k" "$how"
    if [ "$how" = up ]; then # the routes of a NIC that went down are gone: put them back
        nic_routes "$i" "$k"
    fi
}

# Cuts (or heals) every path between nodes A and B: rules ahead of the per-NIC tables send
# their traffic for each other's addresses nowhere, both ways; other nodes are unaffected.
cmd_partition() {
    load
    [ $# -eq 3 ] || die "partition A B cut|heal"
    local a=$1 b=$2 how=$3 k x y
    case $how in cut) how=add ;; heal) how=del ;; *) die "partition: cut or heal, not $how" ;; esac
    for ((k = 0; k < NICS; k++)); do
        for x in "$a:$b" "$b:$a"; do
            y=${x#*:}
            ip -n "$(ns_node "${x%:*}")" rule "$how" to "$NET.$k.$((y + 1))" blackhole \
                priority 50 2>/dev/null || [ "$how" = del ]
        done
    done
}

# Sets NIC K of node I to RATE both ways (a link that slows to a crawl: 8bit stalls it).
cmd_rate() {
    load
    [ $# -eq 3 ] || die "rate NODE NIC RATE"
    local i=$1 k=$2 rate=$3 ns dev
    rate_bits "$rate" >/dev/null
    local c parent
    for x in "$(ns_node "$i"):pn$k" "$(ns_sw):$(sw_port "$i" "$k")"; do
        ns=${x%%:*} dev=${x#*:}
        # Every class: the children's guaranteed share would otherwise keep the NIC going.
        for c in $(tc -n "$ns" class show dev "$dev" | awk '{print $3}'); do
            parent=1:1
            [ "$c" = 1:1 ] && parent=1:
            tc -n "$ns" class change dev "$dev" parent "$parent" classid "$c" htb rate "$rate" \
                ceil "$rate" burst "$BURST" cburst "$BURST" quantum 32768
        done
    done
}

# Runs "$@" inside node $1 with its own host name.
in_node() {
    local i=$1; shift
    ip netns exec "$(ns_node "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
        "$(ns_node "$i")" "$@"
}

cmd_exec() {
    load
    local i=$1; shift
    [ "${1:-}" = -- ] && shift
    in_node "$i" "$@"
}

# PCCL_NIC_MAP for M local ranks: the user's, else the local ranks spread evenly over the
# NICs in blocks (Cray MPICH's syntax, NIC:local ranks).
nic_map() {
    local m=$1 map=${PCCL_NIC_MAP:-} k l part
    if [ -z "$map" ]; then
        for ((k = 0; k < NICS; k++)); do
            part=""
            for ((l = 0; l < m; l++)); do
                [ $((l * NICS / m)) = "$k" ] && part+="${part:+,}$l"
            done
            [ -n "$part" ] && map+="${map:+;}$k:$part"
        done
    fi
    echo "$map"
}

cmd_run() {
    load
    local m=1 timeout=0 mpi=0 keep=0 pin=0
    while [ $# -gt 0 ]; do
        case $1 in
            --ranks-per-node) m=$2; shift 2 ;;
            --timeout) timeout=$2; shift 2 ;;
            --mpi) mpi=1; shift ;;
            --pin) pin=1; shift ;;
            --keep-logs) keep=1; shift ;;
            --) shift; break ;;
            *) die "run: unknown option $1 (the command goes after --)" ;;
        esac
    done
    [ $# -gt 0 ] || die "run: no command (run [options] -- CMD ARGS...)"
    local s run world; s=$(state); run="$s/run"; world=$((NODES * m))
    rm -rf "$run"; mkdir -p "$run"; chmod 700 "$run"
    if [ "$mpi" = 1 ]; then
        run_mpi "$m" "$timeout" "$pin" "$@"
        return
    fi
    : >"$s/pids"
    local r i l map
    map=$(nic_map "$m")
    for ((i = 0; i < NODES; i++)); do
        local pre=()
        [ "$pin" = 1 ] && pre=(taskset -c "$(node_cores "$i")")
        for ((l = 0; l < m; l++)); do
            r=$((i * m + l))
            env PCCL_RANK="$r" PCCL_WORLD_SIZE="$world" LOCAL_RANK="$l" LOCAL_WORLD_SIZE="$m" \
                PCCL_UNIQUE_ID_FILE="$run/id" PCCL_TOPO_FILE="$s/topo.xml" \
                PCCL_NIC_MAP="$map" PCCL_CLUSTER_NODE="$i" \
                "${pre[@]}" ip netns exec "$(ns_node "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
                "$(ns_node "$i")" "$@" >"$run/rank$r.log" 2>&1 &
            echo $! >>"$s/pids"
        done
    done
    local tail_pid='' start rc=0 pid left
    mapfile -t pids <"$s/pids"
    # Rank 0's output as it comes; tail ends once rank 0 has (after printing all of it).
    tail -n +1 -F --pid="${pids[0]}" "$run/rank0.log" 2>/dev/null &
    tail_pid=$!
    start=$(date +%s)
    for ((r = 0; r < world; r++)); do
        pid=${pids[$r]}
        while kill -0 "$pid" 2>/dev/null; do
            if [ "$timeout" -gt 0 ] && [ $(($(date +%s) - start)) -ge "$timeout" ]; then
                echo "cluster.sh: run timed out after ${timeout}s; killing the ranks" >&2
                {
                    kill -9 "${pids[@]}"
                    for ((i = 0; i < NODES; i++)); do
                        left=$(ip netns pids "$(ns_node "$i")" || true)
                        [ -n "$left" ] && kill -9 $left
                    done
                    wait "${pids[@]}"
                } 2>/dev/null || true
                rc=124
                break 2
            fi
            sleep 0.1
        done
        local st=0
        wait "$pid" || st=$?
        if [ "$st" != 0 ] && [ "$rc" = 0 ]; then
            rc=$st
            echo "cluster.sh: rank $r exited with $st; its log:" >&2
            tail -n 20 "$run/rank$r.log" >&2
        fi
    done
    wait "$tail_pid" 2>/dev/null || true
    : >"$s/pids"
    [ "$keep" = 1 ] || rm -f "$run/id"
    return "$rc"
}

# The cores node i owns under --pin: core i mod C when there are at least as many nodes as
# cores C, else a contiguous range of C/N.
node_cores() {
    local i=$1 ncpu; ncpu=$(nproc)
    if [ "$NODES" -ge "$ncpu" ]; then
        echo $((i % ncpu))
    else
        echo "$((i * ncpu / NODES))-$(((i + 1) * ncpu / NODES - 1))"
    fi
}

# MPICH's mpiexec in the switch namespace; hydra's ssh launcher enters each node instead
# (with --pin, on the node's cores: hydra's proxy and the ranks it starts inherit them).
run_mpi() {
    local m=$1 timeout=$2 pin=$3; shift 3
    command -v mpiexec >/dev/null || die "run --mpi: no mpiexec"
    local s enter hosts="" i cores=""; s=$(state); enter="$s/enter.sh"
    if [ "$pin" = 1 ]; then
        for ((i = 0; i < NODES; i++)); do cores+="    $(ns_node "$i")) pre=(taskset -c $(node_cores "$i")) ;;"$'\n'; done
    fi
    cat >"$enter" <<EOF
#!/usr/bin/env bash
# hydra: enter.sh [ssh options] HOST COMMAND... : runs COMMAND in HOST's namespace.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
pre=()
case \$host in
$cores    *) ;;
esac
exec "\${pre[@]}" ip netns exec "\$host" unshare --uts sh -c "hostname \$host && cd $(printf %q "$PWD") && exec \$*"
EOF
    chmod 755 "$enter"
    for ((i = 0; i < NODES; i++)); do hosts+="$(ns_node "$i"):$m,"; done
    local t=()
    [ "$timeout" -gt 0 ] && t=(timeout --kill-after=5 "$timeout")
    ip netns exec "$(ns_sw)" env UCX_TLS=tcp,self PCCL_TOPO_FILE="$s/topo.xml" \
        PCCL_NIC_MAP="$(nic_map "$m")" \
        "${t[@]}" mpiexec -launcher ssh -launcher-exec "$enter" -iface br0 \
        -hosts "${hosts%,}" -np $((NODES * m)) "$@"
}

main() {
    [ $# -gt 0 ] || die "usage: cluster.sh up|run|exec|link|partition|rate|counters|profile|status|down ... (see the header)"
    local c=$1; shift
    case $c in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        counters) cmd_counters ;;
        profile) cmd_profile "$@" ;;
        link) cmd_link "$@" ;;
        partition) cmd_partition "$@" ;;
        rate) cmd_rate "$@" ;;
        exec) cmd_exec "$@" ;;
        run) cmd_run "$@" ;;
        *) die "unknown command $c" ;;
    esac
}
main "$@"
