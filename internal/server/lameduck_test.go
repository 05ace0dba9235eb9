package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An API replica that is stopping refuses new connections but still
// answers a request a client sends on a kept-alive connection it had,
// closing that connection after the answer (Connection: close). Before,
// the shutdown closed idle connections at once, and such a request got
// no answer at all: the stock SDK's "fetch failed" in TestRollingUpgrade,
// as a replica was replaced.
func TestStoppingReplicaAnswersOnKeptAliveConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	up := make(chan struct{})
	go func() {
		done <- serveClients(ctx, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, "got "+string(b))
		}), slog.New(slog.DiscardHandler), func(string) { close(up) })
	}()
	<-up
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	post := func(body string) (*http.Response, string, error) {
		resp, err := c.Post("http://"+addr+"/", "text/plain", strings.NewReader(body))
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	if _, got, err := post("one"); err != nil || got != "got one" {
		t.Fatalf("before the stop: %q %v", got, err)
	}
	// The connection is idle in the client's pool. Stop the replica and
	// wait until it refuses new connections.
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("the stopping replica still accepts connections")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, got, err := post("two")
	if err != nil || got != "got two" {
		t.Fatalf("a request on the kept-alive connection while stopping: %q %v, want it answered", got, err)
	}
	if !resp.Close {
		t.Error("the answer while stopping keeps its connection open; want Connection: close")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(LameDuck + 10*time.Second):
		t.Fatal("the replica did not stop")
	}
}
