package engine

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/spore-run/spore/internal/errdefs"
)

// DefaultMemoryReserve is the host memory kept free of sandboxes when the
// engine's MemoryReserve is 0: 1 GiB, enough for the host's own work and
// for the sandboxes already running to grow a little.
const DefaultMemoryReserve int64 = 1 << 30

// admit refuses a new instance when the host's available memory is below
// the reserve. It is checked before each instance is launched, so the
// sandboxes already running are never put at risk by one more.
func (e *Engine) admit() error {
	reserve := e.reserve
	if reserve == 0 {
		reserve = DefaultMemoryReserve
	}
	if reserve < 0 {
		return nil
	}
	read := e.memAvail
	if read == nil {
		read = MemAvailable
	}
	avail, err := read()
	if err != nil {
		e.log.Warn("read available memory; admitting", "err", err)
		return nil
	}
	if avail < reserve {
		return fmt.Errorf("host memory low: %d MiB available, %d MiB kept in reserve; kill or hibernate sandboxes, or add hosts: %w",
			avail>>20, reserve>>20, errdefs.ErrResourceLimit)
	}
	return nil
}

// MemAvailable returns the host's MemAvailable from /proc/meminfo, in bytes.
func MemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable line")
}
