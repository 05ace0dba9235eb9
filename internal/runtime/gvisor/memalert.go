package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Memory alerts: the host tells a sandbox's init when the sandbox's memory
// rises, so the guest's own OOM watchdog (envd's oomwatch) can poll rarely
// while memory is low. Every poll wakes the sandbox, and a wake costs the
// host ~1.7 ms of CPU under systrap whatever the poll does (measured), so
// a watchdog that must catch a hog growing from idle on its own polls
// often enough to cost ~0.2-0.7 % of a core per idle sandbox.
//
// The host learns it for free: the v1 memory cgroup notifies an eventfd
// when the instance's usage crosses a registered threshold
// (cgroup.event_control). Thresholds at AlertShares of the limit; on every
// upward crossing the driver sends the instance's Spec.MemoryAlertSignal
// to its init (`runsc kill`), rate-limited per instance. Instances without
// one get nothing: an init without a handler would die of it. Nothing
// runs while memory stays put. The eventfds are read through Go's poller
// (no thread each). The signal is kept in the instance's directory, for
// re-arming after the engine restarts (Recover).

// AlertShares are the shares of an instance's memory limit whose upward
// crossing alerts its init.
var AlertShares = []float64{0.5, 0.6, 0.7, 0.8, 0.9}

// alertSignals are the signals Spec.MemoryAlertSignal may name.
var alertSignals = map[string]bool{"USR1": true, "USR2": true}

func (d *Driver) alertFile(id string) string {
	return filepath.Join(d.instDir(id), "memory-alert-signal")
}

// memAlerts holds each instance's armed eventfd.
type memAlerts struct {
	mu    sync.Mutex
	files map[string]*os.File // instance -> eventfd
	// pending: instances whose thresholds are being registered. Each
	// registration waits for an RCU grace period in the kernel
	// (synchronize_rcu in the memory cgroup's register_event), ~13 ms,
	// five of them ~65 ms: measured as the whole gap between a restore
	// and the runsc restore inside it. So it runs beside the start or
	// restore's answer, not in it; disarming waits for it.
	pending map[string]chan struct{}
}

// armMemoryAlertsAsync arms instance id's alerts in the background.
func (d *Driver) armMemoryAlertsAsync(id string, pid int) {
	d.alerts.mu.Lock()
	if d.alerts.pending == nil {
		d.alerts.pending = map[string]chan struct{}{}
	}
	if d.alerts.pending[id] != nil {
		d.alerts.mu.Unlock()
		return
	}
	done := make(chan struct{})
	d.alerts.pending[id] = done
	d.alerts.mu.Unlock()
	go func() {
		defer func() {
			d.alerts.mu.Lock()
			delete(d.alerts.pending, id)
			d.alerts.mu.Unlock()
			close(done)
		}()
		d.armMemoryAlerts(id, pid)
	}()
}

// waitArming waits for a registration of instance id in progress.
func (d *Driver) waitArming(id string) {
	d.alerts.mu.Lock()
	done := d.alerts.pending[id]
	d.alerts.mu.Unlock()
	if done != nil {
		<-done
	}
}

// MemoryAlerts reports whether the driver alerts instances' inits when
// their memory rises (v1 memory cgroups with event_control).
func (d *Driver) MemoryAlerts() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "cgroup.event_control"))
	return err == nil
}

// armMemoryAlerts registers the thresholds of instance id, whose sandbox
// process is pid. Failures are logged: the guest's watchdog still polls,
// only more slowly than it would like.
func (d *Driver) armMemoryAlerts(id string, pid int) {
	sig, err := readBounded(d.alertFile(id), 16)
	if err != nil || !alertSignals[string(sig)] {
		return // none asked for
	}
	memcg := cgroupDirOf(pid, "memory")
	if memcg == "" {
		return
	}
	limit := readInt(filepath.Join(memcg, "memory.limit_in_bytes"))
	if limit <= 0 || limit >= 1<<62 { // no limit: nothing to approach
		return
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		d.log.Warn("memory alerts: eventfd", "instance", id, "err", err)
		return
	}
	f := os.NewFile(uintptr(efd), "memalert-"+id)
	if err := registerThresholds(memcg, efd, limit); err != nil {
		d.log.Warn("memory alerts: register thresholds", "instance", id, "err", err)
		f.Close()
		return
	}
	d.alerts.mu.Lock()
	if d.alerts.files == nil {
		d.alerts.files = map[string]*os.File{}
	}
	if old := d.alerts.files[id]; old != nil {
		old.Close()
	}
	d.alerts.files[id] = f
	d.alerts.mu.Unlock()
	go d.forwardAlerts(id, string(sig), memcg, limit, f)
}

// registerThresholds writes "<eventfd> <usage fd> <bytes>" for every share.
func registerThresholds(memcg string, efd int, limit int64) error {
	ufd, err := unix.Open(filepath.Join(memcg, "memory.usage_in_bytes"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ufd) // the kernel keeps what it needs
	ctl := filepath.Join(memcg, "cgroup.event_control")
	for _, s := range AlertShares {
		line := fmt.Sprintf("%d %d %d", efd, ufd, int64(float64(limit)*s))
		if err := os.WriteFile(ctl, []byte(line), 0o200); err != nil {
			return err
		}
	}
	return nil
}

// forwardAlerts signals the instance's init after each upward crossing
// until the eventfd is closed (disarm) or the cgroup goes (the kernel
// signals the eventfd once as it removes the events).
func (d *Driver) forwardAlerts(id, sig, memcg string, limit int64, f *os.File) {
	defer d.disarmMemoryAlerts(id, f)
	usagePath := filepath.Join(memcg, "memory.usage_in_bytes")
	low := int64(float64(limit) * AlertShares[0])
	var last time.Time
	buf := make([]byte, 8)
	for {
		if _, err := f.Read(buf); err != nil {
			return // closed
		}
		usage := readInt(usagePath)
		if usage < 0 {
			return // the cgroup is gone
		}
		// Crossings downward also notify; and a burst of crossings needs
		// one signal: the guest then polls closely on its own.
		if usage < low || time.Since(last) < 100*time.Millisecond {
			continue
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
		_, err := d.runscFor(ctx, id, d.cfg.Timeout, "kill", id, sig)
		cancel()
		if err != nil && d.exists(id) {
			d.log.Warn("memory alert: signal init", "instance", id, "usage", usage, "err", err)
		}
	}
}

// disarmMemoryAlerts closes instance id's eventfd (f, or whichever is
// armed when f is nil); closing it unregisters the thresholds.
func (d *Driver) disarmMemoryAlerts(id string, f *os.File) {
	if f == nil {
		d.waitArming(id) // else it would arm after this, for nothing
	}
	d.alerts.mu.Lock()
	cur := d.alerts.files[id]
	if f == nil || cur == f {
		delete(d.alerts.files, id)
		f = cur
	}
	d.alerts.mu.Unlock()
	if f != nil {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			d.log.Debug("memory alerts: close", "instance", id, "err", err)
		}
	}
}

// alertsArmed reports whether instance id has memory alerts armed or
// being armed.
func (d *Driver) alertsArmed(id string) bool {
	d.alerts.mu.Lock()
	defer d.alerts.mu.Unlock()
	return d.alerts.files[id] != nil || d.alerts.pending[id] != nil
}
