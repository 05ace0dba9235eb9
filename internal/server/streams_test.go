package server

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/proxy"
)

// A stream proxied through one API replica ends promptly when its sandbox
// goes through another replica (killed, hibernated, rolled back): the
// replica that holds the stream hears of nothing, but the stream is a hop
// through the node's proxy, and the node sees its instance go. Two
// replicas (control plane + proxy each) over one store and one node; the
// "sandbox" answers with a stream that never ends by itself, as a network
// that no longer exists would.
func TestStreamEndsWhenAnotherReplicaActs(t *testing.T) {
	for _, op := range []string{"kill", "hibernate", "rollback"} {
		t.Run(op, func(t *testing.T) {
			_, srv := nodeServer(t)
			ctx := testCtx(t)
			ctlA, st, regA := apiSide(t, srv)
			regB := newRegistry(insecurePair(t).replica, regA.log)
			ctlB := control.New(control.Config{Store: st, Nodes: regB, Hop: regB.hop})
			t.Cleanup(ctlB.Close)
			addr := strings.TrimPrefix(srv.URL, "http://")
			if _, err := ctlA.Heartbeat(ctx, "na", addr, mustInfo(t, srv), true); err != nil {
				t.Fatal(err)
			}
			if err := ctlA.Joined(ctx, "na"); err != nil {
				t.Fatal(err)
			}
			for _, reg := range []*registry{regA, regB} {
				if _, err := reg.refresh(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			sb, err := ctlA.Create(ctx, control.CreateRequest{Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			snap, err := ctlA.Snapshot(ctx, sb.ID, "", false)
			if err != nil {
				t.Fatal(err)
			}
			l, err := net.Listen("tcp", net.JoinHostPort(sb.Addr, "0"))
			if err != nil {
				t.Fatal(err)
			}
			inner := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("started\n"))
				w.(http.Flusher).Flush()
				<-r.Context().Done() // never ends by itself
			})}
			go inner.Serve(l)
			t.Cleanup(func() { inner.Close() })
			port := l.Addr().(*net.TCPAddr).Port

			pxA := proxy.New(ctlA, nil, nil).WithHop(regA.hopTransport, "http")
			front := httptest.NewServer(api.New(api.Config{Control: ctlA, Store: st, Proxy: pxA}))
			t.Cleanup(front.Close)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/stream", nil)
			req.Header.Set("E2b-Sandbox-Id", sb.ID)
			req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || line != "started\n" {
				t.Fatalf("stream through replica A: %d %q %v", resp.StatusCode, line, err)
			}
			ended := make(chan error, 1)
			go func() { _, err := io.Copy(io.Discard, br); ended <- err }()

			switch op {
			case "kill":
				err = ctlB.Kill(ctx, sb.ID)
			case "hibernate":
				err = ctlB.Hibernate(ctx, sb.ID)
			case "rollback":
				_, err = ctlB.Rollback(ctx, sb.ID, snap.ID)
			}
			if err != nil {
				t.Fatalf("%s through replica B: %v", op, err)
			}
			select {
			case err := <-ended:
				t.Logf("stream ended after the %s: %v", op, err)
			case <-time.After(15 * time.Second):
				t.Fatalf("the stream through replica A is still open 15 s after a %s through replica B", op)
			}
			if op != "kill" {
				if err := ctlA.Kill(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// noEvents is a node whose event stream cannot be had.
type noEvents struct{ nodeapi.Node }

func (noEvents) Events(context.Context) (<-chan nodeapi.Event, error) {
	return nil, errdefs.ErrUnavailable
}

// Without events (a lagging or failed subscription), the node proxy's
// sweep still ends a target whose instance went.
func TestNodeProxySweepEndsTargets(t *testing.T) {
	n := controltest.New(t)
	ctx := testCtx(t)
	ln := local.New(n.Engine, local.Config{ID: "na"})
	r := newNodeResolver(ctx, noEvents{ln}, slog.New(slog.DiscardHandler))
	sb, err := ln.Create(ctx, nodeapi.CreateRequest{SandboxID: ids.New('i'), AccessToken: "tok", Template: controltest.Templates[0]})
	if err != nil {
		t.Fatal(err)
	}
	_, running, found, gone := r.Lookup(sb.ID)
	if !running || !found || gone == nil {
		t.Fatalf("lookup: running %v found %v", running, found)
	}
	if err := ln.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(5 * nodeSweepEvery):
		t.Fatal("the sweep did not end the target of a killed sandbox")
	}
}
