package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// grants records the order in which waiters got their slots.
type grants struct {
	mu    sync.Mutex
	order []string
}

func (g *grants) add(s string) {
	g.mu.Lock()
	g.order = append(g.order, s)
	g.mu.Unlock()
}

// queue starts a waiter for team named name and returns once it waits.
func queue(t *testing.T, g *launchGate, team, name string, got *grants, releases chan<- func()) {
	t.Helper()
	before := g.load().Queued
	go func() {
		rel, err := g.acquire(context.Background(), team)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		got.add(name)
		releases <- rel
	}()
	for g.load().Queued == before {
		time.Sleep(time.Millisecond)
	}
}

// Another team's launch gets the next free slot ahead of a burst's queue,
// a team's own launches go in order, and the slots are never exceeded.
func TestLaunchGateServesTheOtherTeamFirst(t *testing.T) {
	ctx := context.Background()
	g := newLaunchGate(2)
	relA1, _ := g.acquire(ctx, "a")
	relA2, _ := g.acquire(ctx, "a")
	got := &grants{}
	releases := make(chan func(), 10)
	for _, n := range []string{"a3", "a4", "a5"} {
		queue(t, g, "a", n, got, releases)
	}
	queue(t, g, "b", "b1", got, releases)
	if l := g.load(); l.Running != 2 || l.Queued != 4 {
		t.Fatalf("load %+v, want 2 running, 4 queued", l)
	}
	relA1()
	first := <-releases
	relA2()
	second := <-releases
	first()
	third := <-releases
	second()
	<-releases
	third()
	got.mu.Lock()
	defer got.mu.Unlock()
	want := []string{"b1", "a3", "a4", "a5"}
	for i := range want {
		if i >= len(got.order) || got.order[i] != want[i] {
			t.Fatalf("grant order %v, want %v", got.order, want)
		}
	}
}

// Between waiting teams with as many running, the one served longest ago
// goes first; never-served teams go in the order they came.
func TestLaunchGateRoundRobin(t *testing.T) {
	ctx := context.Background()
	g := newLaunchGate(1)
	rel, _ := g.acquire(ctx, "x")
	got := &grants{}
	releases := make(chan func(), 10)
	queue(t, g, "a", "a1", got, releases)
	queue(t, g, "a", "a2", got, releases)
	queue(t, g, "b", "b1", got, releases)
	queue(t, g, "b", "b2", got, releases)
	queue(t, g, "c", "c1", got, releases)
	rel()
	for range 5 {
		(<-releases)()
	}
	want := []string{"a1", "b1", "c1", "a2", "b2"}
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.order) != len(want) {
		t.Fatalf("grant order %v, want %v", got.order, want)
	}
	for i := range want {
		if got.order[i] != want[i] {
			t.Fatalf("grant order %v, want %v", got.order, want)
		}
	}
}

// A wait that is canceled leaves the queue and holds nothing; the gate
// forgets teams with nothing running or waiting.
func TestLaunchGateCancel(t *testing.T) {
	g := newLaunchGate(1)
	rel, _ := g.acquire(context.Background(), "a")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := g.acquire(ctx, "b")
		errc <- err
	}()
	for g.load().Queued == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled wait: %v", err)
	}
	if l := g.load(); l.Queued != 0 || l.Running != 1 {
		t.Fatalf("after the cancel: %+v", l)
	}
	rel()
	rel() // twice: once only
	if l := g.load(); l.Running != 0 || len(g.teams) != 0 {
		t.Fatalf("after the release: %+v, %d teams kept", l, len(g.teams))
	}
	r2, err := g.acquire(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	r2()
}

// Many launches of three teams at once: never more than the slots run,
// every one runs, and nothing is held at the end.
func TestLaunchGateUnderLoad(t *testing.T) {
	g := newLaunchGate(3)
	var running, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			var cancel context.CancelFunc = func() {}
			if i%7 == 0 { // some give up while waiting
				ctx, cancel = context.WithTimeout(ctx, time.Duration(i%5)*time.Millisecond)
			}
			defer cancel()
			rel, err := g.acquire(ctx, []string{"a", "b", "c"}[i%3])
			if err != nil {
				return
			}
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(100 * time.Microsecond)
			running.Add(-1)
			rel()
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 3 {
		t.Fatalf("%d launches ran at once through 3 slots", p)
	}
	if l := g.load(); l.Running != 0 || l.Queued != 0 || len(g.teams) != 0 {
		t.Fatalf("at the end: %+v, %d teams kept", l, len(g.teams))
	}
}

// No bound: acquire never waits.
func TestLaunchGateOff(t *testing.T) {
	g := newLaunchGate(launchSlots(-1))
	for range 100 {
		if _, err := g.acquire(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	if launchSlots(0) < 4 || launchSlots(3) != 3 {
		t.Fatalf("launchSlots: 0 -> %d, 3 -> %d", launchSlots(0), launchSlots(3))
	}
}
