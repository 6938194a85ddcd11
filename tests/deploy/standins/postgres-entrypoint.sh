#!/bin/sh
# The official postgres image's first start, the part Trainyard uses: an empty data
# directory gets a cluster owned by POSTGRES_USER (password POSTGRES_PASSWORD, asked of
# every TCP client) and the database POSTGRES_DB; then the server runs as given.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?is required (the official image refuses to start without it)}"
    user=${POSTGRES_USER:-postgres}
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    initdb --username="$user" --pwfile=/tmp/pwfile --auth-local=trust \
        --auth-host=scram-sha-256 -D "$PGDATA"
    rm -f /tmp/pwfile
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "${POSTGRES_DB:-$user}" != postgres ]; then
        # on the socket only, so no client sees the server before its database exists
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        createdb --username="$user" "${POSTGRES_DB:-$user}"
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
fi
exec "$@"
