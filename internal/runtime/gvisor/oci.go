package gvisor

import (
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/spore-run/spore/internal/runtime"
)

// defaultCaps is the capability set of root inside a sandbox: the set
// container runtimes give by default. gVisor enforces them in its own
// kernel; none of them reach the host.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

const cpuPeriod = 100_000 // microseconds

// ociSpec builds the OCI runtime configuration of an instance.
func ociSpec(s runtime.Spec, cgroupParent string) *specs.Spec {
	env := s.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	caps := &specs.LinuxCapabilities{Bounding: defaultCaps, Permitted: defaultCaps, Effective: defaultCaps}
	if s.User.UID != 0 {
		caps = &specs.LinuxCapabilities{Bounding: defaultCaps}
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.NetNS}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: shmOptions(s.Limits)},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, m := range s.Mounts {
		opts := []string{"rbind"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		mounts = append(mounts, specs.Mount{Destination: m.Destination, Type: "bind", Source: m.Source, Options: opts})
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:         specs.User{UID: s.User.UID, GID: s.User.GID},
			Args:         s.Args,
			Env:          env,
			Cwd:          cwd,
			Capabilities: caps,
			Rlimits:      rlimits(s.Limits),
		},
		Root:     &specs.Root{Path: s.RootFS},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: cgroupPath(cgroupParent, s.ID),
			Resources:   resources(s.Limits),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, netns,
			},
		},
	}
}

// shmOptions are the mount options of /dev/shm. Without a size gVisor's
// tmpfs may grow to half the host's memory, and a full one kills the whole
// sandbox at its memory limit (killing processes frees none of it); with
// one, filling it fails with ENOSPC. The options must be exactly those of
// the image a restore reads, hence the size comes from the instance's
// recorded limits and is absent when they have none.
func shmOptions(l runtime.Limits) []string {
	opts := []string{"nosuid", "noexec", "nodev", "mode=1777"}
	if l.ShmMB > 0 {
		opts = append(opts, "size="+strconv.FormatInt(l.ShmMB, 10)+"m")
	}
	return opts
}

// cgroupPath is the instance's cgroup for runsc ("" when the driver
// manages cgroups itself: runsc is then told to ignore them).
func cgroupPath(parent, id string) string {
	if parent == "" {
		return ""
	}
	return parent + "/" + id
}

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if l.VCPUs > 0 {
		quota := int64(l.VCPUs * cpuPeriod)
		period := uint64(cpuPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if l.MemoryMB > 0 {
		limit := l.MemoryMB << 20
		r.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if l.MaxProcs > 0 {
		// The guest's own limit is RLIMIT_NPROC (see rlimits): fork fails
		// with EAGAIN inside the sandbox. The host pids cgroup is only a
		// backstop, because reaching it kills the whole sandbox; systrap
		// uses about 2.5 host tasks per guest process, measured.
		r.Pids = &specs.LinuxPids{Limit: new(pidsMax(l))}
	}
	return r
}

// pidsMax is the host pids cgroup limit of an instance.
func pidsMax(l runtime.Limits) int64 { return 4*l.MaxProcs + 256 }

func rlimits(l runtime.Limits) []specs.POSIXRlimit {
	rl := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}}
	if l.MaxProcs > 0 {
		// gVisor enforces RLIMIT_NPROC for every user without
		// CAP_SYS_ADMIN or CAP_SYS_RESOURCE, root of the sandbox included
		// (defaultCaps has neither).
		n := uint64(l.MaxProcs)
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	return rl
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if len(e) > len(key) && e[:len(key)] == key && e[len(key)] == '=' {
			return true
		}
	}
	return false
}
