#!/usr/bin/env bash
# services.sh: make sure the servers paygate's tests talk to are installed and running on loopback.
#
#   scripts/services.sh up      install (apt-get) what is missing, start what is not running
#   scripts/services.sh down    stop the Redis Cluster this script started (leaves Redis and RabbitMQ alone)
#   scripts/services.sh status  print what answers
#
# Redis       127.0.0.1:6379            (no persistence)
# RabbitMQ    127.0.0.1:5672            guest/guest
# Cluster     127.0.0.1:7000-7002       3 masters, no replicas, files in $PAYGATE_CLUSTER_DIR
# chromium    installed only: headless, for the dashboard's page test
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
*)
	echo "usage: $0 up|down|status" >&2
	exit 2
	;;
esac
