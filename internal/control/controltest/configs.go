package controltest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/rpc"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/postgres"
	"github.com/spore-run/spore/internal/store/sqlite"
	"github.com/spore-run/spore/internal/testenv"
)

// Config is one way of running the control plane in a test: the store
// it keeps its rows in and how it reaches the node. The same control
// tests run in every Config (Each), so `spore up`'s shape (SQLite, the
// node in process) and a fleet's (PostgreSQL, nodes over the node
// protocol) are held to the same behaviour.
type Config struct {
	Name     string
	Postgres bool // PostgreSQL (testenv.Postgres: the package's TestMain must call testenv.Main), else SQLite
	RPC      bool // the node through nodeapi/rpc over a loopback HTTP server, else in process
}

// Configs are the configurations Each runs.
var Configs = []Config{
	{Name: "sqlite-local"},
	{Name: "postgres-rpc", Postgres: true, RPC: true},
}

// Each runs fn as a subtest per Config.
func Each(t *testing.T, fn func(t *testing.T, c Config)) {
	for _, c := range Configs {
		t.Run(c.Name, func(t *testing.T) { fn(t, c) })
	}
}

// ConfigOf is the Config a test runs under, from its name
// (TestX/<config>/...): tests written as Each(t, fn) where fn does not
// take the Config find it this way. A test not run under Each gets the
// first (SQLite, in process).
func ConfigOf(t testing.TB) Config {
	if parts := strings.Split(t.Name(), "/"); len(parts) > 1 {
		for _, c := range Configs {
			if parts[1] == c.Name {
				return c
			}
		}
	}
	return Configs[0]
}

// Store opens an empty store of the Config's kind, closed when t ends.
func (c Config) Store(t testing.TB) store.Store {
	t.Helper()
	ctx := context.Background()
	var st store.Store
	var err error
	if c.Postgres {
		st, err = postgres.Open(ctx, testenv.Postgres(t))
	} else {
		st, err = sqlite.Open(ctx, filepath.Join(t.TempDir(), "spore.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Node is n as the Config reaches it: itself, or a client of it over the
// node protocol.
func (c Config) Node(t testing.TB, n nodeapi.Node) nodeapi.Node {
	if !c.RPC {
		return n
	}
	return Remote(t, n)
}

// Remote serves n over the node protocol on a loopback listener (h2c,
// with a cluster token, as a node agent does) until t ends and returns a
// client of it.
func Remote(t testing.TB, n nodeapi.Node) nodeapi.Node {
	t.Helper()
	token := ids.New('k') + ids.New('k')
	path, h, err := rpc.NewHandler(n, token)
	if err != nil {
		t.Fatal(err)
	}
	// The calls in flight are counted here: the node protocol is h2c, whose
	// connections httptest's Close neither tracks nor waits for, and a
	// call the client gave up on (an upload the control plane's Close cut)
	// would otherwise go on writing into directories t's cleanup removes.
	var (
		mu       sync.Mutex
		closed   bool
		inFlight sync.WaitGroup
	)
	mux := http.NewServeMux()
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if closed {
			mu.Unlock()
			http.Error(w, "closed", http.StatusServiceUnavailable)
			return
		}
		inFlight.Add(1)
		mu.Unlock()
		defer inFlight.Done()
		h.ServeHTTP(w, r)
	}))
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = rpc.Server(mux, nil)
	srv.Start()
	hc := rpc.HTTPClient(nil)
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		srv.CloseClientConnections()
		srv.Close()
		mu.Lock()
		closed = true
		mu.Unlock()
		inFlight.Wait()
	})
	cl, err := rpc.NewClient(srv.URL, token, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
