#!/usr/bin/env bash
# A container engine for deploy/ (the real Docker Compose against a real engine), on a developer
# or CI machine: the running Docker engine when one answers, else Podman serving the Docker API.
#
#   eval "$(scripts/container_engine.sh start [STATE_DIR])"   # prints the variables to export
#   scripts/container_engine.sh stop [STATE_DIR]              # stops what `start` started
#
# Exit status of `start`: 0 with the exports on stdout; 3 when no engine can be had here (the
# reason on stderr: not root and no Podman, packages not installable, ...). `make compose-test`
# skips then, saying why.
#
# STATE_DIR (default $XDG_CACHE_HOME/qwen3-tts/container-engine, i.e. ~/.cache/...) keeps the
# downloaded torch wheels between runs; the images and their layers (the base image stand-in, the
# torch layer) stay in Podman's own storage, so a second run on the same machine rebuilds neither.
#
# Podman, and why each step (these machines: root, Debian bookworm, no image registry reachable,
# package traffic through a TLS proxy with its own CA):
# - Debian's podman, runc and debootstrap, installed with apt when missing (root only).
# - runc, not crun (crun fails on the hybrid cgroup layout here), cgroupfs (no systemd), and
#   lower default ulimits (nofile, nproc: containers fail to start with the defaults): written to
#   STATE_DIR/containers.conf and passed as CONTAINERS_CONF, so the machine's /etc is untouched.
# - `podman system service` serves the Docker API on STATE_DIR/podman.sock (DOCKER_HOST).
#   BuildKit cannot be pulled, so builds use the classic builder (DOCKER_BUILDKIT=0,
#   COMPOSE_BAKE=false); Podman's builder (Buildah) understands COPY --chmod.
# - The Dockerfile's base image cannot be pulled: a stand-in is built with debootstrap (Debian
#   bookworm, python3 with venv, pip and its headers, `python` on PATH, this machine's CA bundle
#   and pip's `cert` setting) and tagged docker.io/library/python:3.11-slim-bookworm, the
#   Dockerfile's default PYTHON_IMAGE. It differs from the official image in one way: Debian's
#   Python 3.11 in /usr/bin instead of a source build in /usr/local (symlinked there).
# - torch: the CPU wheel pip resolves for `torch==2.13.0` on this machine (the same spec as the
#   Makefile) and its dependencies, served as a PEP 503 index on loopback port 18766
#   (QWEN3TTS_TORCH_INDEX_PORT; TORCH_INDEX_URL), the same URL every run so that the torch layer's
#   build cache holds (a build argument's value is part of the layer's cache key). The build reaches loopback only on the host network
#   (QWEN3TTS_BUILD_NETWORK=host, compose `build.network`).
# - Podman without systemd schedules no healthchecks: a loop runs them (every 3 s while a
#   container is starting or unhealthy, every 15 s once healthy), so `depends_on:
#   condition: service_healthy` and `docker compose up --wait` work.
# - Ports published on the host's loopback do not reach the containers: talk to a container at
#   its address on its compose network (the Docker API's NetworkSettings.Networks).
set -euo pipefail
verb=${1:-start}
STATE=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-tts/container-engine}
PYTHON=${PYTHON:-python3}
BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
INDEX_PORT=${QWEN3TTS_TORCH_INDEX_PORT:-18766}
mkdir -p "$STATE"
log() { echo "container-engine: $*" >&2; }
alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }
export CONTAINERS_CONF="$STATE/containers.conf"

stop_started() {
  local name
  for name in healthchecks index service; do
    if alive "$name"; then kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true; fi
    rm -f "$STATE/$name.pid"
  done
}

case "$verb" in
  stop) stop_started; exit 0 ;;
  start) ;;
  *) log "usage: $0 start|stop [STATE_DIR]"; exit 2 ;;
esac

# 1. A running engine (Docker, or whatever DOCKER_HOST points at) is used as it is.
if [ "${DOCKER_HOST:-}" != "unix://$STATE/podman.sock" ] && command -v docker >/dev/null \
  && timeout 20 docker info >/dev/null 2>&1; then
  log "using the running engine ($(docker info --format '{{.Name}} {{.ServerVersion}}' 2>/dev/null || echo docker))"
  echo "export QWEN3TTS_ENGINE=docker"
  exit 0
fi

# 2. Podman.
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "no container engine answers and Podman cannot be installed here (needs root and apt-get)"
    exit 3
  fi
  log "installing podman, runc and debootstrap (apt)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap; } \
    >"$STATE/apt.log" 2>&1; then
    log "apt-get could not install podman, runc, debootstrap (see $STATE/apt.log)"
    exit 3
  fi
fi
if [ "$(id -u)" != 0 ]; then
  log "Podman is installed but this is not root: rootless Podman is not set up by this script"
  exit 3
fi
cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF

if ! podman image exists "$BASE_IMAGE"; then
  log "building the base image stand-in $BASE_IMAGE (debootstrap, about 2 min)"
  # The machine's own Debian mirror: its active entries only (a comment may name an unreachable one).
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -E '^(URIs:|deb )' \
    | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)
  rootfs="$STATE/rootfs"
  rm -rf "$rootfs"
  if ! debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python3-dev,ca-certificates \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$STATE/debootstrap.log" 2>&1; then
    log "debootstrap failed (see $STATE/debootstrap.log)"
    rm -rf "$rootfs"
    exit 3
  fi
  ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python3"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
fi

if ! alive index; then
  files="$STATE/index/files"
  mkdir -p "$files"
  if ! ls "$files"/torch-* >/dev/null 2>&1; then
    log "downloading $TORCH_SPEC and its dependencies for the local index"
    if ! "$PYTHON" -m pip download -q --only-binary=:all: "$TORCH_SPEC" -d "$files" >"$STATE/pip.log" 2>&1; then
      log "pip could not download $TORCH_SPEC (see $STATE/pip.log)"
      rm -rf "$files"
      exit 3
    fi
  fi
  "$PYTHON" - "$STATE/index" <<'PY'
import collections, os, re, sys

root = sys.argv[1]
by_project = collections.defaultdict(list)
for name in sorted(os.listdir(os.path.join(root, "files"))):
    project = re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()  # PEP 503 normalized
    by_project[project].append(name)
for project, names in by_project.items():
    os.makedirs(os.path.join(root, "simple", project), exist_ok=True)
    with open(os.path.join(root, "simple", project, "index.html"), "w") as page:
        page.write("".join(f'<a href="../../files/{n}">{n}</a><br>\n' for n in names))
PY
  # A fixed port by default: the index URL is a build argument of the torch layer, so a new URL
  # would rebuild that layer; a free one only when something else holds it.
  port=$INDEX_PORT
  if ! "$PYTHON" -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
    port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    log "port $INDEX_PORT is taken: the torch index is on $port (the torch layer is rebuilt for a new URL)"
  fi
  nohup "$PYTHON" -m http.server "$port" --bind 127.0.0.1 --directory "$STATE/index" \
    >"$STATE/index.log" 2>&1 </dev/null &
  echo $! >"$STATE/index.pid"
  echo "$port" >"$STATE/index.port"
fi

if ! alive service; then
  rm -f "$STATE/podman.sock"
  nohup podman system service --time=0 "unix://$STATE/podman.sock" >"$STATE/service.log" 2>&1 </dev/null &
  echo $! >"$STATE/service.pid"
  for _ in $(seq 1 100); do [ -S "$STATE/podman.sock" ] && break; sleep 0.1; done
  [ -S "$STATE/podman.sock" ] || { log "podman system service did not start (see $STATE/service.log)"; exit 3; }
fi

if ! alive healthchecks; then
  nohup bash -c '
    tick=0
    while true; do
      if [ $((tick % 5)) = 0 ]; then states="starting unhealthy healthy"; else states="starting unhealthy"; fi
      for state in $states; do
        for c in $(podman ps --filter "health=$state" --format "{{.ID}}" 2>/dev/null); do
          podman healthcheck run "$c" >/dev/null 2>&1 || true
        done
      done
      tick=$((tick + 1))
      sleep 3
    done' >/dev/null 2>&1 </dev/null &
  echo $! >"$STATE/healthchecks.pid"
fi

cat <<EOF
export QWEN3TTS_ENGINE=podman
export CONTAINERS_CONF=$CONTAINERS_CONF
export DOCKER_HOST=unix://$STATE/podman.sock
export DOCKER_BUILDKIT=0
export COMPOSE_BAKE=false
export TORCH_INDEX_URL=http://127.0.0.1:$(cat "$STATE/index.port")/simple
export QWEN3TTS_BUILD_NETWORK=host
EOF
