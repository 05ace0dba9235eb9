package fleet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
)

// StateFile is the fleet's record in its directory: every process,
// namespace, interface, firewall table and directory `up` made, written
// before (directories, namespaces) or right after (processes) each is
// made, so that `down` removes exactly those, even after a failed or
// killed `up`.
const StateFile = "fleet.json"

const stateVersion = 1

// State is what a fleet is made of.
type State struct {
	Version int       `json:"version"`
	Dir     string    `json:"dir"`
	Prefix  string    `json:"prefix"`
	Started time.Time `json:"started"`
	// Complete is set once `up` finished: every process answered.
	Complete bool `json:"complete"`
	// Executable is the spore binary the fleet runs (down re-executes it to
	// purge each node's sandboxes inside the node's namespace).
	Executable string `json:"executable"`

	Processes []Proc    `json:"processes"`
	Netns     []string  `json:"netns"`      // named namespaces (/var/run/netns)
	Veths     []string  `json:"veths"`      // root-namespace ends of the nodes' links
	NftTables []NftName `json:"nft_tables"` // root-namespace tables
	Dirs      []string  `json:"dirs"`       // made by up, removed by down (Dir last)
	// IPForwardWas is the host's net.ipv4.ip_forward before up changed it
	// ("" when up left it as it was: already on).
	IPForwardWas string `json:"ip_forward_was,omitempty"`

	Postgres *Postgres `json:"postgres,omitempty"`
	S3       *S3       `json:"s3,omitempty"` // the default blob store's server`
	APIURLs  []string  `json:"api_urls,omitempty"`
	Nodes    []Node    `json:"nodes,omitempty"`
	KeyFile  string    `json:"api_key_file"`
	// MetricsTokenFile holds the token a Prometheus scrape of a replica's
	// or a node's /metrics presents (docs/metrics.md).
	MetricsTokenFile string `json:"metrics_token_file,omitempty"`
	// CADir holds the fleet CA (fleetauth.CAFiles: ca.crt, ca.key,
	// join-token).
	CADir string `json:"ca_dir"`
}

// Proc is a process the fleet started, identified by PID and start time
// (so that a recycled PID is never signalled).
type Proc struct {
	Role      string   `json:"role"` // "postgres", "s3", "node", "api"
	Name      string   `json:"name"`
	PID       int      `json:"pid"`
	StartTime uint64   `json:"start_time"` // /proc/PID/stat field 22 (clock ticks after boot)
	Netns     string   `json:"netns,omitempty"`
	Args      []string `json:"args"`
	Log       string   `json:"log"`
}

// NftName names an nftables table.
type NftName struct {
	Family string `json:"family"` // "inet"
	Name   string `json:"name"`
}

// Postgres is the fleet's metadata database.
type Postgres struct {
	Bin  string `json:"bin"`
	Dir  string `json:"dir"`
	Port int    `json:"port"`
	DSN  string `json:"dsn"`
}

// Node is one node agent's place.
type Node struct {
	Index     int    `json:"index"`
	ID        string `json:"id"`
	Netns     string `json:"netns"`
	Veth      string `json:"veth"`      // root end
	HostAddr  string `json:"host_addr"` // root end's address (the node's gateway; where it reaches the API)
	Addr      string `json:"addr"`      // the node's address in its namespace
	Listen    string `json:"listen"`    // host:port of its RPC service
	DataDir   string `json:"data_dir"`
	NetPrefix string `json:"net_prefix"`
	APIURL    string `json:"api_url"`
	// Metrics is where the agent serves its metrics (host:port on its
	// link; with State.MetricsTokenFile).
	Metrics string `json:"metrics,omitempty"`
	// PurgeArgs are the flags `spore fleet purge-node` gets to open this
	// node's data directory the way the agent did.
	PurgeArgs []string `json:"purge_args"`
}

func statePath(dir string) string { return filepath.Join(dir, StateFile) }

// Load reads the fleet state in dir; errdefs.ErrNotFound when none.
func Load(dir string) (*State, error) {
	var s State
	if err := atomicfs.ReadJSON(statePath(dir), &s); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no fleet in %s: %w", dir, errdefs.ErrNotFound)
		}
		return nil, err
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("fleet state %s has version %d, this binary knows %d: %w", statePath(dir), s.Version, stateVersion, errdefs.ErrInvalidArgument)
	}
	return &s, nil
}

// save writes the state atomically (0600: it names the key files).
func (s *State) save() error { return atomicfs.WriteJSONNoSync(statePath(s.Dir), s) }

// lock takes the lock of the fleet directory's parent (one up or down at
// a time there). The parent, not the directory: down removes the directory
// while holding the lock, and no lock file is left behind.
func lock(dir string) (func(), error) {
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Open(parent)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another `spore fleet` command works in %s now: %w", parent, errdefs.ErrConflict)
	}
	return func() { f.Close() }, nil
}
