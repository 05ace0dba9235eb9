#!/usr/bin/env bash
# Regenerates the Go code for proto/*.proto into proto/gen (committed).
# Needs protoc (Debian protobuf-compiler) and the two plugins, which
# `make proto` installs at pinned versions into the cache.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-gen}
mkdir -p "$out"
protoc -I . \
  --go_out="$out" --go_opt=paths=source_relative \
  --connect-go_out="$out" --connect-go_opt=paths=source_relative \
  process/process.proto filesystem/filesystem.proto node/v1/node.proto
