// Package volume manages volumes: named, persistent file trees that
// sandboxes mount (E2B's Volume, plus Spore's exclusive and read-only
// mounts). The Catalog is the volumes' records in the store: it checks
// names, modes and sizes, mints each volume's content token, and refuses
// to delete a volume a sandbox holds (docs/volumes.md).
package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// Size bounds, in bytes.
const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30
	// MinSize: an ext4 file system with a journal needs a few MiB; 16 MiB
	// leaves room for content.
	MinSize = 16 * MiB
	// MaxSize bounds one volume (a sparse image costs nothing until
	// written, but a quota above the host's disk would never be met).
	MaxSize = 1 << 40
	// DefaultSize is a volume's quota when none is asked for.
	DefaultSize = 10 * GiB
	// MaxPage bounds a page of List (and is its default).
	MaxPage = 100
)

// TokenPrefix starts every volume content token, so a token is told from
// an API key at a glance (and in a leaked log).
const TokenPrefix = "spv_"

var (
	// Names: a letter or digit, then letters, digits, '.', '_' or '-'; up
	// to 63 characters (a name appears in mount tables and CLI arguments).
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	// idRE is the shape of the IDs NewID mints: a name of this shape is
	// refused, so a ref (ID or name) is never ambiguous.
	idRE = regexp.MustCompile(`^v[a-z0-9]{19}$`)
)

// NewID mints a volume ID.
func NewID() string { return ids.New('v') }

// CopyFor is the record of the volume a sandbox restored from a snapshot
// of an exclusive volume m (a fork child, a create from the snapshot)
// gets: a new exclusive volume with m's quota, held by sandbox on node,
// whose ID is the one the node's engine derives for the content it makes
// (ids.Derive('v', sandbox, volume)) and whose name is m's followed by
// the sandbox's ID, owned by the sandbox's team.
func CopyFor(m store.VolumeMount, team, sandbox, node string) store.Volume {
	name := m.Name
	if max := 62 - len(sandbox); len(name) > max {
		name = name[:max]
	}
	return store.Volume{
		ID: ids.Derive('v', sandbox, m.VolumeID), TeamID: team, Name: name + "-" + sandbox, Mode: store.VolumeExclusive,
		SizeBytes: m.SizeBytes, Token: newToken(), Holder: sandbox, NodeID: node, Users: []string{sandbox}, MadeFor: sandbox,
	}
}

// IsID reports whether ref has the shape of a volume ID.
func IsID(ref string) bool { return idRE.MatchString(ref) }

// ValidateName checks a volume name.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalidf("volume name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if IsID(name) {
		return errdefs.Invalidf("volume name %q has the shape of a volume ID; choose another", name)
	}
	return nil
}

// ValidateRef checks a volume ID or name as given in a path.
func ValidateRef(ref string) error {
	if IsID(ref) || nameRE.MatchString(ref) {
		return nil
	}
	return errdefs.Invalidf("volume %q is neither a volume ID nor a volume name", ref)
}

// ValidateMode checks a mode and returns it with the default filled in.
func ValidateMode(mode string) (string, error) {
	switch mode {
	case "":
		return store.VolumeShared, nil
	case store.VolumeShared, store.VolumeExclusive:
		return mode, nil
	}
	return "", errdefs.Invalidf("volume mode %q: use %q (many sandboxes, outside snapshots) or %q (one sandbox, captured with its snapshots)", mode, store.VolumeShared, store.VolumeExclusive)
}

// ValidateSize checks a quota in bytes and returns it with the default
// filled in (0: DefaultSize).
func ValidateSize(size int64) (int64, error) {
	if size == 0 {
		return DefaultSize, nil
	}
	if size < MinSize || size > MaxSize {
		return 0, errdefs.Invalidf("volume size %s: must be between %s and %s", FormatSize(size), FormatSize(MinSize), FormatSize(MaxSize))
	}
	return size, nil
}

// ParseSize reads a size as written on a command line: a number of bytes
// with a unit (K, M, G, T, with or without "iB"/"B", powers of 1024), or
// a bare number of MiB.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	f, err := strconv.ParseFloat(num, 64)
	if num == "" || err != nil || f < 0 {
		return 0, errdefs.Invalidf("size %q: want a number with a unit, like 512M or 10G", s)
	}
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	shift := map[string]uint{"": 20, "K": 10, "M": 20, "G": 30, "T": 40}
	sh, ok := shift[unit]
	if !ok {
		return 0, errdefs.Invalidf("size %q: unknown unit %q (use K, M, G or T)", s, t[i:])
	}
	if f*float64(int64(1)<<sh) > float64(MaxSize)*2 {
		return 0, errdefs.Invalidf("size %q is too large", s)
	}
	return int64(f * float64(int64(1)<<sh)), nil
}

// FormatSize writes a size in the largest binary unit that keeps it
// whole (or with one decimal).
func FormatSize(n int64) string {
	for _, u := range []struct {
		s    string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", 1 << 10}} {
		if n >= u.size {
			if n%u.size == 0 {
				return fmt.Sprintf("%d %s", n/u.size, u.s)
			}
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.s)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// MaxMounts is how many volumes one sandbox mounts (its template's
// volume slots, nodeapi.MaxVolumeMounts).
const MaxMounts = 4

// systemPaths are where a volume may not be mounted: at or under the
// first group (the kernel's and Spore's own), at exactly the second (a
// directory the system needs whole).
var (
	systemTrees = []string{"/proc", "/sys", "/dev", "/run", "/opt/spore"}
	systemDirs  = []string{"/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib64", "/opt", "/root", "/sbin", "/tmp", "/usr", "/var"}
)

// ValidateMountPath checks where a sandbox is to see a volume: absolute,
// clean, not a system directory nor under one of the kernel's or
// Spore's trees.
func ValidateMountPath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || len(p) > 255 || strings.ContainsAny(p, "\x00\n") {
		return errdefs.Invalidf("volume mount path %q: want a clean absolute path (no '..', no trailing '/')", p)
	}
	for _, t := range systemTrees {
		if p == t || strings.HasPrefix(p, t+"/") {
			return errdefs.Invalidf("volume mount path %q is in the system's %s", p, t)
		}
	}
	if slices.Contains(systemDirs, p) {
		return errdefs.Invalidf("volume mount path %q is a system directory; mount under it (like %s/data)", p, strings.TrimSuffix(p, "/"))
	}
	return nil
}

// ValidateMounts checks a sandbox's mount paths: each valid, at most
// MaxMounts, none inside another.
func ValidateMounts(paths []string) error {
	if len(paths) > MaxMounts {
		return errdefs.Invalidf("%d volume mounts: at most %d", len(paths), MaxMounts)
	}
	for i, p := range paths {
		if err := ValidateMountPath(p); err != nil {
			return err
		}
		for _, q := range paths[:i] {
			if p == q || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return errdefs.Invalidf("volume mount paths %q and %q overlap", q, p)
			}
		}
	}
	return nil
}

// newToken mints a content token: 32 random bytes.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// Store is what the catalog reads and writes: the volumes, and the
// sandboxes that use them.
type Store interface {
	store.Volumes
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
}

// Catalog is the volumes' records.
type Catalog struct {
	st Store
}

// NewCatalog returns the catalog over st.
func NewCatalog(st Store) *Catalog {
	return &Catalog{st: st}
}

// CreateOptions are a new volume's settings.
type CreateOptions struct {
	TeamID string // the team that owns it ("": the default team)
	Name   string
	Mode   string // "" is shared
	Size   int64  // bytes; 0 is DefaultSize
}

// Create stores a new volume. A name in use is ErrAlreadyExists; bad
// settings are ErrInvalidArgument, and nothing is stored.
func (c *Catalog) Create(ctx context.Context, o CreateOptions) (store.Volume, error) {
	if err := ValidateName(o.Name); err != nil {
		return store.Volume{}, err
	}
	mode, err := ValidateMode(o.Mode)
	if err != nil {
		return store.Volume{}, err
	}
	size, err := ValidateSize(o.Size)
	if err != nil {
		return store.Volume{}, err
	}
	if o.TeamID == "" {
		o.TeamID = store.DefaultTeam
	}
	v := store.Volume{ID: NewID(), TeamID: o.TeamID, Name: o.Name, Mode: mode, SizeBytes: size, Token: newToken()}
	if err := c.st.CreateVolume(ctx, v); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return store.Volume{}, fmt.Errorf("%w: a volume named %q exists", errdefs.ErrAlreadyExists, o.Name)
		}
		return store.Volume{}, err
	}
	return c.st.GetVolume(ctx, v.TeamID, v.ID)
}

// teamOr is team, or the default team for "" (callers from before
// teams act in it).
func teamOr(team string) string {
	if team == "" {
		return store.DefaultTeam
	}
	return team
}

// Get returns a team's volume by ID or name (another team's is
// ErrNotFound).
func (c *Catalog) Get(ctx context.Context, team, ref string) (store.Volume, error) {
	if err := ValidateRef(ref); err != nil {
		return store.Volume{}, err
	}
	return c.st.GetVolume(ctx, teamOr(team), ref)
}

// List returns a page of a team's volumes, oldest first, and the token of
// the next ("" at the end). limit <= 0 or over MaxPage: MaxPage.
func (c *Catalog) List(ctx context.Context, team string, limit int, next string) ([]store.Volume, string, error) {
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}
	return c.st.ListVolumes(ctx, teamOr(team), limit, next)
}

// Delete removes a team's volume's record. A volume a sandbox holds is
// ErrConflict (checked in the delete's transaction), and stays.
func (c *Catalog) Delete(ctx context.Context, team, ref string) (store.Volume, error) {
	if err := ValidateRef(ref); err != nil {
		return store.Volume{}, err
	}
	v, err := c.st.GetVolume(ctx, teamOr(team), ref)
	if err != nil {
		return store.Volume{}, err
	}
	// The users gone for good, checked outside the delete's transaction;
	// one added since is not among them, and keeps the volume.
	dead := map[string]bool{}
	for _, id := range v.Users {
		alive, err := c.alive(ctx, id)
		if err != nil {
			return store.Volume{}, err
		}
		if alive {
			return store.Volume{}, fmt.Errorf("%w: volume %s is mounted by sandbox %s; kill the sandbox first", errdefs.ErrConflict, v.Name, id)
		}
		dead[id] = true
	}
	var gone store.Volume
	err = c.st.DeleteVolume(ctx, v.TeamID, v.ID, func(v store.Volume) error {
		if v.Holder != "" && !dead[v.Holder] {
			return fmt.Errorf("%w: volume %s is mounted by sandbox %s; kill the sandbox first", errdefs.ErrConflict, v.Name, v.Holder)
		}
		for _, id := range v.Users {
			if !dead[id] {
				return fmt.Errorf("%w: volume %s was just mounted by sandbox %s", errdefs.ErrConflict, v.Name, id)
			}
		}
		gone = v
		return nil
	})
	return gone, err
}

// alive reports whether a sandbox that was given a volume still holds it:
// its row exists and it did not die (an errored sandbox's instance is
// gone; only a kill remains for it).
func (c *Catalog) alive(ctx context.Context, id string) (bool, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return sb.State != store.StateError, nil
}

// ErrBadToken: a content request's token is not the volume's (HTTP 401).
var ErrBadToken = errors.New("volume token refused")

// Authorize returns the volume ref names if token is its content token.
// A wrong token and an unknown volume are the same ErrBadToken, so a
// token holder learns nothing of other volumes.
func (c *Catalog) Authorize(ctx context.Context, ref, token string) (store.Volume, error) {
	deny := fmt.Errorf("%w: a valid volume token is required for volume %s", ErrBadToken, ref)
	if ValidateRef(ref) != nil || !strings.HasPrefix(token, TokenPrefix) {
		return store.Volume{}, deny
	}
	// By ID only (team ""): names are a team's, and the token is the
	// proof here, not a key.
	v, err := c.st.GetVolume(ctx, "", ref)
	if errdefs.IsNotFound(err) {
		return store.Volume{}, deny
	}
	if err != nil {
		return store.Volume{}, err
	}
	if subtle.ConstantTimeCompare([]byte(v.Token), []byte(token)) != 1 {
		return store.Volume{}, deny
	}
	return v, nil
}
