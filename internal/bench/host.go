package bench

import (
	"bufio"
	"context"
	"errors"
	"os"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/spore-run/spore/internal/engine"
)

// machineInfo describes this host (the bench runs where the server runs
// when it measures bare runsc and density).
func machineInfo(b *Bare) Machine {
	m := Machine{CPUs: goruntime.NumCPU(), GoVersion: goruntime.Version(), Platform: "systrap", Cgroups: "v2"}
	m.Hostname, _ = os.Hostname()
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m.Kernel = utsString(u.Release[:])
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		m.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		m.Cgroups = "v1"
	}
	if b != nil {
		m.Runsc = b.Version()
		if b.Platform != "" {
			m.Platform = b.Platform
		}
	}
	return m
}

func utsString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() int64 {
	v, _ := engine.MemAvailable()
	return v
}

// parallel runs fn(0..n-1) on workers goroutines and joins the errors.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for range min(workers, max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}
