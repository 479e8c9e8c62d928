#!/usr/bin/env bash
# services.sh: make sure the servers paygate's tests talk to are installed and running on loopback.
#
#   scripts/services.sh up      install (apt-get) what is missing, start what is not running
#   scripts/services.sh down    stop the Redis Cluster this script started (leaves Redis and RabbitMQ alone)
#   scripts/services.sh status  print what answers
#   scripts/services.sh sentinel up|down
#                               a Sentinel set: a primary, one replica, three sentinels (not part of "up";
#                               the failover tests start their own with PAYGATE_SENTINEL_PORTS and _DIR)
#
# Redis       127.0.0.1:6379            (no persistence)
# RabbitMQ    127.0.0.1:5672            guest/guest
# Cluster     127.0.0.1:7000-7002       3 masters, no replicas, files in $PAYGATE_CLUSTER_DIR
# chromium    installed only: headless, for the dashboard's page test
# Sentinel    127.0.0.1:6380 primary, 6381 replica, sentinels 26379-26381, master name "paygate",
#             files in $PAYGATE_SENTINEL_DIR; ports from $PAYGATE_SENTINEL_PORTS ("primary replica s1 s2 s3")
#
# Idempotent: running "up" twice is harmless and fast when everything already answers.
set -euo pipefail

CLUSTER_PORTS=(7000 7001 7002)
CLUSTER_DIR=${PAYGATE_CLUSTER_DIR:-${TMPDIR:-/tmp}/paygate-redis-cluster}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

log() { echo "services: $*" >&2; }

apt_install() {
	log "installing $*"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local secs=$1 what=$2
	shift 2
	for _ in $(seq 1 $((secs * 5))); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	log "timed out after ${secs}s waiting for $what"
	return 1
}

ensure_packages() {
	local missing=()
	command -v redis-server >/dev/null || missing+=(redis-server)
	command -v redis-cli >/dev/null || missing+=(redis-tools)
	command -v rabbitmq-server >/dev/null || missing+=(rabbitmq-server)
	command -v chromium >/dev/null || missing+=(chromium) # the dashboard's page test (headless)
	if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
}

redis_up() {
	if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
	log "starting redis on 127.0.0.1:6379"
	redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
		--dir "${TMPDIR:-/tmp}" --logfile "${TMPDIR:-/tmp}/paygate-redis-6379.log"
	wait_for 20 "redis on 6379" redis-cli -h 127.0.0.1 -p 6379 ping
}

rabbitmq_up() {
	if port_open 5672; then return; fi
	log "starting rabbitmq on 127.0.0.1:5672"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	$SUDO rabbitmq-server -detached >/dev/null 2>&1 || true
	wait_for 120 "rabbitmq on 5672" port_open 5672
	# The port opens a little before the broker accepts logins.
	wait_for 60 "rabbitmq to boot" $SUDO rabbitmqctl await_startup
}

cluster_ok() { redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

cluster_up() {
	if cluster_ok; then return; fi
	mkdir -p "$CLUSTER_DIR"
	local fresh=0
	for p in "${CLUSTER_PORTS[@]}"; do
		if redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1; then continue; fi
		log "starting redis cluster node on 127.0.0.1:$p"
		rm -f "$CLUSTER_DIR/nodes-$p.conf"
		fresh=1
		redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
			--cluster-enabled yes --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 5000 \
			--dir "$CLUSTER_DIR" --logfile "$CLUSTER_DIR/redis-$p.log"
		wait_for 20 "cluster node $p" redis-cli -h 127.0.0.1 -p "$p" ping
	done
	if ! cluster_ok; then
		# A node that holds slots or knows other nodes from an earlier cluster cannot join a new one.
		for p in "${CLUSTER_PORTS[@]}"; do
			redis-cli -h 127.0.0.1 -p "$p" flushall >/dev/null 2>&1 || true
			redis-cli -h 127.0.0.1 -p "$p" cluster reset hard >/dev/null 2>&1 || true
		done
		local nodes=()
		for p in "${CLUSTER_PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
		log "creating redis cluster ${nodes[*]} (fresh nodes: $fresh)"
		redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
		wait_for 30 "cluster_state:ok" cluster_ok
	fi
}

cluster_down() {
	for p in "${CLUSTER_PORTS[@]}"; do
		redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
	done
	rm -rf "$CLUSTER_DIR"
}

SENTINEL_PORTS=(${PAYGATE_SENTINEL_PORTS:-6380 6381 26379 26380 26381})
SENTINEL_DIR=${PAYGATE_SENTINEL_DIR:-${TMPDIR:-/tmp}/paygate-redis-sentinel}

# sentinel_up starts the primary, its replica and three sentinels watching it as "paygate" (quorum 2),
# quick to fail over (down after 1s), each with a pid file in $SENTINEL_DIR. Run again on a set that
# stands, it restarts a Redis that is down (the sentinels make it a replica of the primary in force),
# as a supervisor would.
sentinel_up() {
	local primary=${SENTINEL_PORTS[0]} replica=${SENTINEL_PORTS[1]} fresh=1
	if redis-cli -p "${SENTINEL_PORTS[2]}" sentinel get-master-addr-by-name paygate >/dev/null 2>&1; then fresh=0; fi
	mkdir -p "$SENTINEL_DIR"
	for p in "$primary" "$replica"; do
		if redis-cli -p "$p" ping >/dev/null 2>&1; then continue; fi
		local extra=()
		if [ "$p" = "$replica" ] && [ $fresh = 1 ]; then extra=(--replicaof 127.0.0.1 "$primary"); fi
		log "starting redis $p for the sentinel set"
		redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no --repl-diskless-sync-delay 0 \
			--dir "$SENTINEL_DIR" --logfile "$SENTINEL_DIR/redis-$p.log" --pidfile "$SENTINEL_DIR/redis-$p.pid" "${extra[@]}"
		wait_for 20 "redis on $p" redis-cli -h 127.0.0.1 -p "$p" ping
	done
	if [ $fresh = 0 ]; then return; fi
	wait_for 20 "the replica on $replica to sync" sh -c "redis-cli -p $replica info replication | grep -q master_link_status:up"
	for p in "${SENTINEL_PORTS[@]:2}"; do
		cat >"$SENTINEL_DIR/sentinel-$p.conf" <<-EOF
			port $p
			bind 127.0.0.1
			daemonize yes
			pidfile $SENTINEL_DIR/sentinel-$p.pid
			logfile $SENTINEL_DIR/sentinel-$p.log
			dir $SENTINEL_DIR
			sentinel monitor paygate 127.0.0.1 $primary 2
			sentinel down-after-milliseconds paygate 1000
			sentinel failover-timeout paygate 5000
			sentinel parallel-syncs paygate 1
		EOF
		log "starting sentinel $p"
		redis-server "$SENTINEL_DIR/sentinel-$p.conf" --sentinel
		wait_for 20 "sentinel on $p" redis-cli -p "$p" ping
	done
	# Each sentinel must know the replica and the other two before a failover can elect one.
	wait_for 30 "the sentinels to find each other" sh -c \
		"redis-cli -p ${SENTINEL_PORTS[2]} sentinel master paygate | grep -A1 -x num-other-sentinels | tail -1 | grep -qx 2"
}

sentinel_down() {
	for f in "$SENTINEL_DIR"/*.pid; do
		[ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
	done
	rm -rf "$SENTINEL_DIR"
}

status() {
	printf 'redis    6379  %s\n' "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || echo down)"
	printf 'rabbitmq 5672  %s\n' "$(port_open 5672 && echo up || echo down)"
	printf 'cluster  7000  %s\n' "$(cluster_ok && echo ok || echo down)"
}

case "${1:-up}" in
up)
	ensure_packages
	redis_up
	cluster_up
	rabbitmq_up
	status
	;;
down) cluster_down ;;
status) status ;;
sentinel)
	case "${2:-up}" in
	up)
		ensure_packages
		sentinel_up
		;;
	down) sentinel_down ;;
	*)
		echo "usage: $0 sentinel up|down" >&2
		exit 2
		;;
	esac
	;;
*)
	echo "usage: $0 up|down|status|sentinel up|down" >&2
	exit 2
	;;
esac
