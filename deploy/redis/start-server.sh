#!/bin/sh
# Starts a Redis server of a Sentinel deployment in the role the sentinels give it now:
#
#   start-server.sh redis-server [options...]
#
# The options give the role of the very first start (`--replicaof HOST PORT` or none). When a
# sentinel answers, the primary most of them name overrides it: this server becomes its replica, or
# the primary again when they name this server.
#
# Why: a server that restarts after a failover and starts as the primary it was serves its old data
# until the sentinels demote it (about 8 s later), and a failover in that window can promote it. Redis
# then throws away every write the new primary took since the first failover. Started as the new
# primary's replica, the server never takes a write of its own.
#
# Environment:
#   REDIS_NAME       this server's host name, as the sentinels know it; announced as a replica too
#   REDIS_PORT       its port (default 6379)
#   REDIS_SENTINELS  the sentinels, "host:port host:port ..." (empty: no Sentinel, as the options say)
#   REDIS_MASTER     the name the sentinels monitor the primary by (default switchboard)
#   REDISCLI_AUTH    the sentinels' password, if they have one (redis-cli reads it)
set -eu

name=${REDIS_NAME:?REDIS_NAME must name this server as the sentinels know it}
port=${REDIS_PORT:-6379}

# One "host port" line per sentinel that answered with an address; a sentinel that is down, refuses,
# or does not know the primary yet adds nothing.
answers=""
for sentinel in ${REDIS_SENTINELS:-}; do
    reply=$(timeout 3 redis-cli -h "${sentinel%:*}" -p "${sentinel##*:}" --raw \
        SENTINEL get-master-addr-by-name "${REDIS_MASTER:-switchboard}" 2>/dev/null) || continue
    # An address is two lines, a host and a port; an error or nil reply is one.
    [ "$(printf '%s\n' "$reply" | wc -l)" -eq 2 ] || continue
    host=$(printf '%s\n' "$reply" | sed -n 1p)
    primary_port=$(printf '%s\n' "$reply" | sed -n 2p)
    case $host in '' | *[!A-Za-z0-9.:_-]*) continue ;; esac
    case $primary_port in '' | *[!0-9]*) continue ;; esac
    answers="$answers$host $primary_port
"
done

primary=$(printf '%s' "$answers" | sort | uniq -c | sort -rn | head -n 1 | awk '{ print $2, $3 }')
if [ -n "$primary" ]; then
    if [ "$primary" = "$name $port" ]; then
        echo "start-server: the sentinels name this server ($name:$port) the primary" >&2
        set -- "$@" --replicaof no one
    else
        echo "start-server: the sentinels name ${primary% *}:${primary#* } the primary; starting as its replica" >&2
        set -- "$@" --replicaof "${primary% *}" "${primary#* }"
    fi
else
    echo "start-server: no sentinel named the primary; starting in the role the options give" >&2
fi
exec "$@" --replica-announce-ip "$name"
