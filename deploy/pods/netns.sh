# Network namespaces on one bridge, the hosts of the pods test
# (deploy/pods/test_pods.sh) and of bench/run.sh commhosts: source it, as
# root. Each function stops at the first command that fails and returns its
# status.

# netns_bridge BRIDGE ADDR: a bridge, up, with ADDR/24 (the host's address
# on it).
netns_bridge() {
  ip link add "$1" type bridge &&
    ip addr add "$2/24" dev "$1" &&
    ip link set "$1" up
}

# netns_host NS VETH BRIDGE ADDR: a network namespace NS joined to BRIDGE by
# a veth pair (VETH on the host side, eth0 inside), with ADDR/24 on eth0 and
# its loopback up.
netns_host() {
  ip netns add "$1" &&
    ip link add "$2" type veth peer name eth0 netns "$1" &&
    ip link set "$2" master "$3" up &&
    ip -n "$1" addr add "$4/24" dev eth0 &&
    ip -n "$1" link set eth0 up &&
    ip -n "$1" link set lo up
}
