#!/usr/bin/env bash
# Builds the S3-compatible server the blob store tests run against
# (internal/blob/s3, testenv.S3) and caches it outside the checkout, keyed by
# version:
#
#   $CACHE_DIR/s3/versitygw-v1.8.0/versitygw
#
# versitygw (Apache-2.0) serves S3 from a plain directory (its posix backend),
# starts in a fraction of a second and is one `go install` away; MinIO's
# server is AGPL and is not used. Nothing but the Go module proxy is reachable
# here, so it is built from source (about 3.5 min on 2 cores). A binary already
# built is never rebuilt: a second run takes milliseconds. The build installs
# into a temporary directory renamed into place at the end, so an interrupted
# run leaves nothing half-built behind.
#
#   scripts/s3-tools.sh        # (make s3-tools); prints the binary's path
set -euo pipefail

CACHE_DIR=${CACHE_DIR:-/var/cache/spore}
GO=${GO:-go}
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}

root="$CACHE_DIR/s3"
mkdir -p "$root"
# One run at a time: two would build into the same directory.
exec 9>"$root/.lock"
flock 9
export GOFLAGS=-buildvcs=false
export GOWORK=off

log() { printf 's3-tools: %s\n' "$*" >&2; }

dir="$root/versitygw-$VERSITYGW_VERSION"
if [ -x "$dir/versitygw" ]; then
  log "versitygw $VERSITYGW_VERSION: cached"
else
  t0=$SECONDS
  log "versitygw $VERSITYGW_VERSION: building (about 3.5 min on 2 cores)"
  work="$dir.build"
  rm -rf "$work" && mkdir -p "$work/out"
  (cd "$work" && GOBIN="$work/out" $GO install -trimpath -ldflags "-s -w" \
    "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION")
  [ -x "$work/out/versitygw" ] || { log "no binary in $work/out"; exit 1; }
  rm -rf "$dir" && mv "$work/out" "$dir"
  rm -rf "$work"
  log "versitygw $VERSITYGW_VERSION: built in $((SECONDS - t0)) s"
fi
echo "$dir/versitygw"
