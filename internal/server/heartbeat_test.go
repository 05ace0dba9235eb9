package server

import (
	"github.com/spore-run/spore/internal/fleetauth"

	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/nodeapi"
)

// infoNode answers Info only: all a heartbeat asks of the node.
type infoNode struct{ nodeapi.Node }

func (infoNode) Info(context.Context) (nodeapi.NodeInfo, error) {
	return nodeapi.NodeInfo{ID: "n1"}, nil
}

// A node given several replicas keeps registering when the first is
// dead: each round tries the next (fleet: one replica's death must not
// make its nodes lost).
func TestHeartbeatFailsOverToTheNextReplica(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused from now on
	var got atomic.Int64
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer live.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, _ := fleetauth.Insecure("0123456789abcdef0123", nil)
		heartbeat(ctx, NodeConfig{APIURL: deadURL + "," + live.URL, AdvertiseAddr: "10.0.0.1:1"},
			"n1", infoNode{}, f, slog.New(slog.DiscardHandler))
	}()
	deadline := time.Now().Add(30 * time.Second)
	for got.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if got.Load() < 2 {
		t.Fatalf("the live replica got %d registrations, want at least 2 (the first replica is dead)", got.Load())
	}
}

func TestAPIURLs(t *testing.T) {
	if u := apiURLs("http://a:1, http://b:2,"); len(u) != 2 || u[0] != "http://a:1" || u[1] != "http://b:2" {
		t.Fatalf("apiURLs = %q", u)
	}
}
