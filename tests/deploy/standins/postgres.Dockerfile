# A stand-in for the official postgres:17.6-bookworm, for machines that cannot pull it
# (scripts/image_check.sh tags it so for its test only): Debian bookworm's PostgreSQL 15,
# with the official image's data directory, environment and first-start setup
# (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB), all that docker-compose.yml uses.
FROM trainyard-standin/debian:bookworm
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/none.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
    && chmod 700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
USER postgres
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
