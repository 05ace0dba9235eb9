module github.com/spore-run/spore

go 1.26.8

require github.com/opencontainers/runtime-spec v1.2.1
