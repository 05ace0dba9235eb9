// Package identity resolves who a request acts as inside the sandbox (the
// user chosen per call with Authorization: Basic) and holds the sandbox-wide
// defaults that /init sets: environment variables, default user and working
// directory, access token, sandbox ID.
package identity

import (
	"context"
	"encoding/base64"
	"fmt"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// User is a resolved account of the sandbox.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Groups []uint32
}

// Lookup resolves a user name from the sandbox's /etc/passwd and group
// files (pure Go: no cgo, no NSS).
func Lookup(name string) (User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return User{}, fmt.Errorf("unknown user %q", name)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	out := User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				out.Groups = append(out.Groups, uint32(n))
			}
		}
	}
	if out.Home == "" {
		out.Home = "/"
	}
	return out, nil
}

// UserFromAuthorization returns the user named by an "Authorization: Basic
// base64(user:)" header, or "" when the header is absent.
func UserFromAuthorization(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", fmt.Errorf("authorization header must be Basic")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", fmt.Errorf("authorization header is not base64")
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}

type ctxKey struct{}

// WithUser returns a context carrying the request's user.
func WithUser(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, ctxKey{}, u)
}

// FromContext returns the request's user.
func FromContext(ctx context.Context) (User, bool) {
	u, ok := ctx.Value(ctxKey{}).(User)
	return u, ok
}

// Defaults are the sandbox-wide settings /init changes. Safe for
// concurrent use.
type Defaults struct {
	lookup    LookupFunc
	mu        sync.RWMutex
	env       map[string]string
	user      string
	workdir   string
	token     string
	sandboxID string
}

// LookupFunc resolves a user name to an account.
type LookupFunc func(name string) (User, error)

// NewDefaults returns defaults with the given default user, resolving
// users with lookup (nil: Lookup, the sandbox's own account files).
func NewDefaults(defaultUser string, lookup LookupFunc) *Defaults {
	if lookup == nil {
		lookup = Lookup
	}
	return &Defaults{env: map[string]string{}, user: defaultUser, lookup: lookup}
}

// Lookup resolves a user name as this daemon does.
func (d *Defaults) Lookup(name string) (User, error) { return d.lookup(name) }

// Update applies an /init. Empty fields keep their value; env vars are
// merged.
func (d *Defaults) Update(env map[string]string, user, workdir, token, sandboxID string, setToken bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, v := range env {
		d.env[k] = v
	}
	if user != "" {
		d.user = user
	}
	if workdir != "" {
		d.workdir = workdir
	}
	if setToken {
		d.token = token
	}
	if sandboxID != "" {
		d.sandboxID = sandboxID
	}
}

// Env returns a copy of the default environment variables.
func (d *Defaults) Env() map[string]string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make(map[string]string, len(d.env))
	for k, v := range d.env {
		out[k] = v
	}
	return out
}

// User returns the default user name.
func (d *Defaults) User() string { d.mu.RLock(); defer d.mu.RUnlock(); return d.user }

// Workdir returns the default working directory ("" = the user's home).
func (d *Defaults) Workdir() string { d.mu.RLock(); defer d.mu.RUnlock(); return d.workdir }

// Token returns the access token ("" = none required).
func (d *Defaults) Token() string { d.mu.RLock(); defer d.mu.RUnlock(); return d.token }

// SandboxID returns the sandbox's identity.
func (d *Defaults) SandboxID() string { d.mu.RLock(); defer d.mu.RUnlock(); return d.sandboxID }

// Resolve turns a path from a request into an absolute path: relative
// paths are relative to the user's home (as the protocol defines), "~"
// expands to it.
func Resolve(u User, p string) string {
	switch {
	case p == "~":
		return u.Home
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(u.Home, p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	default:
		return filepath.Join(u.Home, p)
	}
}
