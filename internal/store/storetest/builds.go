package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Template builds, their logs and tags: what the E2B build API keeps in
// the store, so that any replica answers a poll of a build another runs.

func build(id, template string) store.Build {
	return store.Build{ID: id, Template: template, Status: store.BuildWaiting, Spec: []byte(`{"fromImage":"python:3.12"}`),
		Tags: []string{"latest", "v1"}, CPUCount: 2, MemoryMB: 1024}
}

func testBuilds(t *testing.T, s store.Store) {
	ctx := context.Background()
	before := time.Now().UTC().Add(-time.Second)
	if err := s.CreateBuild(ctx, build("b1", "py")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBuild(ctx, build("b1", "other")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate build ID = %v, want already exists", err)
	}
	got, err := s.GetBuild(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	want := build("b1", "py")
	if got.ID != "b1" || got.Template != "py" || got.Status != store.BuildWaiting || string(got.Spec) != string(want.Spec) ||
		fmt.Sprint(got.Tags) != "[latest v1]" || got.CPUCount != 2 || got.MemoryMB != 1024 || got.Owner != "" {
		t.Fatalf("get = %+v", got)
	}
	if got.CreatedAt.Before(before) || !got.UpdatedAt.Equal(got.CreatedAt) || !got.FinishedAt.IsZero() {
		t.Fatalf("times after create: created %v updated %v finished %v", got.CreatedAt, got.UpdatedAt, got.FinishedAt)
	}
	if _, err := s.GetBuild(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing = %v", err)
	}

	// fn cannot change the ID or CreatedAt; UpdatedAt moves on.
	upd, err := s.UpdateBuild(ctx, "b1", func(b *store.Build) error {
		b.Status, b.Owner = store.BuildBuilding, "replica-a"
		b.ID, b.CreatedAt = "other", time.Time{}
		return nil
	})
	if err != nil || upd.ID != "b1" || upd.Status != store.BuildBuilding || upd.Owner != "replica-a" ||
		!upd.CreatedAt.Equal(got.CreatedAt) || upd.UpdatedAt.Before(got.UpdatedAt) || !upd.FinishedAt.IsZero() {
		t.Fatalf("update = %+v, %v", upd, err)
	}
	if stored, _ := s.GetBuild(ctx, "b1"); fmt.Sprint(stored) != fmt.Sprint(upd) {
		t.Fatalf("stored %+v, update returned %+v", stored, upd)
	}
	if _, err := s.GetBuild(ctx, "other"); !errdefs.IsNotFound(err) {
		t.Fatalf("fn renamed the build: %v", err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateBuild(ctx, "b1", func(b *store.Build) error { b.Status = store.BuildError; return boom }); !errors.Is(err, boom) {
		t.Fatalf("aborted update = %v, want fn's error", err)
	}
	if stored, _ := s.GetBuild(ctx, "b1"); stored.Status != store.BuildBuilding || !stored.UpdatedAt.Equal(upd.UpdatedAt) {
		t.Fatalf("an aborted update changed the build: %+v", stored)
	}
	if _, err := s.UpdateBuild(ctx, "nope", func(*store.Build) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing = %v", err)
	}
	// Finishing sets FinishedAt; it stays as it was on later writes.
	done, err := s.UpdateBuild(ctx, "b1", func(b *store.Build) error {
		b.Status, b.SnapshotID = store.BuildReady, "snap-1"
		return nil
	})
	if err != nil || done.FinishedAt.IsZero() || done.SnapshotID != "snap-1" {
		t.Fatalf("ready = %+v, %v", done, err)
	}
	again, _ := s.UpdateBuild(ctx, "b1", func(b *store.Build) error { b.Owner = ""; return nil })
	if !again.FinishedAt.Equal(done.FinishedAt) {
		t.Fatalf("FinishedAt moved from %v to %v", done.FinishedAt, again.FinishedAt)
	}
	failed := build("b0", "py")
	failed.Status, failed.Reason, failed.FailedStep = store.BuildError, "step 2: exit status 1", "2"
	if err := s.CreateBuild(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetBuild(ctx, "b0"); got.FinishedAt.IsZero() || got.Reason != failed.Reason || got.FailedStep != "2" {
		t.Fatalf("a build created failed: %+v", got)
	}

	// Listing: the template's builds, newest first.
	if err := s.CreateBuild(ctx, build("b2", "py")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBuild(ctx, build("x1", "node")); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListBuilds(ctx, "py")
	if err != nil || buildIDs(l) != "b2 b0 b1 " {
		t.Fatalf("builds of py = %s %v, want b2 b0 b1", buildIDs(l), err)
	}
	if l, err := s.ListBuilds(ctx, "none"); err != nil || len(l) != 0 {
		t.Fatalf("builds of an unknown template = %v %v", l, err)
	}
}

func buildIDs(l []store.Build) string {
	out := ""
	for _, b := range l {
		out += b.ID + " "
	}
	return out
}

// testBuildNoLostUpdate: concurrent read-change-writes of one build over
// two handles (replicas) all land.
func testBuildNoLostUpdate(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if err := a.CreateBuild(ctx, build("c", "py")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		h := []store.Store{a, b}[i%2]
		wg.Go(func() {
			for range 5 {
				if _, err := h.UpdateBuild(ctx, "c", func(x *store.Build) error { x.MemoryMB++; return nil }); err != nil {
					t.Errorf("update: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if got, _ := b.GetBuild(ctx, "c"); got.MemoryMB != 1024+40 {
		t.Fatalf("lost updates: memory %d, want %d", got.MemoryMB, 1024+40)
	}
}

func testBuildLogs(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.AppendBuildLogs(ctx, "nope", store.BuildLog{Message: "x"}); !errdefs.IsNotFound(err) {
		t.Fatalf("append to an unknown build = %v", err)
	}
	if _, err := s.BuildLogs(ctx, "nope", 0, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("logs of an unknown build = %v", err)
	}
	if err := s.CreateBuild(ctx, build("l1", "py")); err != nil {
		t.Fatal(err)
	}
	if l, err := s.BuildLogs(ctx, "l1", 0, 0); err != nil || len(l) != 0 {
		t.Fatalf("logs of a new build = %v %v", l, err)
	}
	if _, err := s.BuildLogs(ctx, "l1", -1, 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative offset = %v", err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC) // nanoseconds are kept
	entry := func(i int) store.BuildLog {
		return store.BuildLog{Time: t0.Add(time.Duration(i) * time.Second), Level: "info", Message: fmt.Sprintf("line %d", i), Step: fmt.Sprint(i / 3)}
	}
	if err := s.AppendBuildLogs(ctx, "l1", entry(0), entry(1), entry(2)); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendBuildLogs(ctx, "l1"); err != nil {
		t.Fatalf("append of nothing = %v", err)
	}
	odd := store.BuildLog{Time: t0, Level: "error", Message: "nul \x00 byte, tab\t, quote \" and ünïcode", Step: "finalize"}
	if err := s.AppendBuildLogs(ctx, "l1", entry(3), entry(4), odd); err != nil {
		t.Fatalf("append with a NUL byte: %v", err)
	}
	all, err := s.BuildLogs(ctx, "l1", 0, 0)
	if err != nil || len(all) != 6 {
		t.Fatalf("all logs = %d entries, %v", len(all), err)
	}
	for i := range 5 {
		if w := entry(i); all[i].Message != w.Message || !all[i].Time.Equal(w.Time) || all[i].Level != "info" || all[i].Step != w.Step {
			t.Fatalf("entry %d = %+v, want %+v", i, all[i], w)
		}
	}
	if all[5].Message != odd.Message || all[5].Level != "error" || all[5].Step != "finalize" {
		t.Fatalf("odd entry = %+q", all[5])
	}
	cases := []struct{ offset, limit, first, n int }{
		{2, 2, 2, 2}, {4, 0, 4, 2}, {4, 10, 4, 2}, {0, 1, 0, 1}, {6, 0, 0, 0}, {100, 5, 0, 0},
	}
	for _, c := range cases {
		got, err := s.BuildLogs(ctx, "l1", c.offset, c.limit)
		if err != nil || len(got) != c.n || (c.n > 0 && got[0].Message != all[c.first].Message) {
			t.Errorf("logs(offset %d, limit %d) = %d entries %v, want %d from %d", c.offset, c.limit, len(got), err, c.n, c.first)
		}
	}
}

// testBuildLogCap: a build keeps at most store.MaxBuildLogs entries, the
// last saying the rest were dropped; entries before it are never
// rewritten.
func testBuildLogCap(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateBuild(ctx, build("cap", "py")); err != nil {
		t.Fatal(err)
	}
	batch := func(from, n int) []store.BuildLog {
		out := make([]store.BuildLog, n)
		for i := range out {
			out[i] = store.BuildLog{Level: "info", Message: fmt.Sprintf("line %d", from+i), Step: "0"}
		}
		return out
	}
	max := store.MaxBuildLogs
	for _, c := range [][2]int{{0, 6000}, {6000, 3998}, {9998, 1}} { // exactly max-1: no marker yet
		if err := s.AppendBuildLogs(ctx, "cap", batch(c[0], c[1])...); err != nil {
			t.Fatal(err)
		}
	}
	if l, _ := s.BuildLogs(ctx, "cap", 0, 0); len(l) != max-1 || l[max-2].Message != fmt.Sprintf("line %d", max-2) {
		t.Fatalf("after %d entries: %d stored", max-1, len(l))
	}
	if err := s.AppendBuildLogs(ctx, "cap", batch(max-1, 50)...); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendBuildLogs(ctx, "cap", batch(max+49, 7)...); err != nil {
		t.Fatalf("append past the cap = %v, want nothing (dropped)", err)
	}
	l, err := s.BuildLogs(ctx, "cap", 0, 0)
	if err != nil || len(l) != max {
		t.Fatalf("capped log = %d entries, %v; want %d", len(l), err, max)
	}
	for i := range max - 1 {
		if l[i].Message != fmt.Sprintf("line %d", i) {
			t.Fatalf("entry %d = %q", i, l[i].Message)
		}
	}
	if last := l[max-1]; last.Level != "warn" || !strings.Contains(last.Message, "truncated") {
		t.Fatalf("last entry = %+v, want the truncation notice", last)
	}
	if tail, _ := s.BuildLogs(ctx, "cap", max-1, 10); len(tail) != 1 || !strings.Contains(tail[0].Message, "truncated") {
		t.Fatalf("tail = %+v", tail)
	}
	// One call larger than the cap on a fresh build.
	if err := s.CreateBuild(ctx, build("cap2", "py")); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendBuildLogs(ctx, "cap2", batch(0, max+1)...); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.BuildLogs(ctx, "cap2", max-2, 0); len(l) != 2 || l[0].Message != fmt.Sprintf("line %d", max-2) || !strings.Contains(l[1].Message, "truncated") {
		t.Fatalf("one huge append: tail %+v", l)
	}
}

// testBuildLogsConcurrent: appenders on two handles lose no entry, and
// each call's entries stay together and in order.
func testBuildLogsConcurrent(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if err := a.CreateBuild(ctx, build("cc", "py")); err != nil {
		t.Fatal(err)
	}
	const writers, calls, per = 8, 20, 4
	var wg sync.WaitGroup
	for w := range writers {
		h := []store.Store{a, b}[w%2]
		wg.Go(func() {
			for c := range calls {
				batch := make([]store.BuildLog, per)
				for e := range batch {
					batch[e] = store.BuildLog{Level: "info", Message: fmt.Sprintf("%d/%d/%d", w, c, e)}
				}
				if err := h.AppendBuildLogs(ctx, "cc", batch...); err != nil {
					t.Errorf("append: %v", err)
				}
			}
		})
	}
	wg.Wait()
	l, err := b.BuildLogs(ctx, "cc", 0, 0)
	if err != nil || len(l) != writers*calls*per {
		t.Fatalf("%d entries, %v; want %d", len(l), err, writers*calls*per)
	}
	next := make([]int, writers) // each writer's next call
	for i := 0; i < len(l); i += per {
		var w, c int
		fmt.Sscanf(l[i].Message, "%d/%d/", &w, &c)
		if c != next[w] {
			t.Fatalf("entry %d: writer %d's call %d, want its call %d", i, w, c, next[w])
		}
		next[w]++
		for e := range per {
			if want := fmt.Sprintf("%d/%d/%d", w, c, e); l[i+e].Message != want {
				t.Fatalf("entry %d = %q, want %q (a call's entries split)", i+e, l[i+e].Message, want)
			}
		}
	}
}

func testTags(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetTag(ctx, "py", "latest"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing tag = %v", err)
	}
	if err := s.DeleteTag(ctx, "py", "latest"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete of a missing tag = %v", err)
	}
	before := time.Now().Add(-time.Second)
	for _, tag := range []string{"v2", "latest", "v1"} {
		if err := s.SetTag(ctx, store.TemplateTag{Template: "py", Tag: tag, BuildID: "b1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetTag(ctx, store.TemplateTag{Template: "node", Tag: "latest", BuildID: "n1"}); err != nil {
		t.Fatal(err)
	}
	first, err := s.GetTag(ctx, "py", "latest")
	if err != nil || first.Template != "py" || first.Tag != "latest" || first.BuildID != "b1" || first.CreatedAt.Before(before) {
		t.Fatalf("get = %+v, %v", first, err)
	}
	// Moving a tag points it at the new build and keeps its CreatedAt.
	if err := s.SetTag(ctx, store.TemplateTag{Template: "py", Tag: "latest", BuildID: "b2"}); err != nil {
		t.Fatal(err)
	}
	moved, err := s.GetTag(ctx, "py", "latest")
	if err != nil || moved.BuildID != "b2" || !moved.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("moved = %+v, %v; created first %v", moved, err, first.CreatedAt)
	}
	l, err := s.ListTags(ctx, "py")
	if err != nil || tagList(l) != "latest=b2 v1=b1 v2=b1 " {
		t.Fatalf("tags of py = %s %v", tagList(l), err)
	}
	if err := s.DeleteTag(ctx, "py", "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTag(ctx, "py", "v1"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted tag = %v", err)
	}
	if l, _ := s.ListTags(ctx, "py"); tagList(l) != "latest=b2 v2=b1 " {
		t.Fatalf("after delete: %s", tagList(l))
	}
	if l, _ := s.ListTags(ctx, "node"); tagList(l) != "latest=n1 " {
		t.Fatalf("tags of node = %s", tagList(l))
	}
	if l, err := s.ListTags(ctx, "none"); err != nil || len(l) != 0 {
		t.Fatalf("tags of an unknown template = %v %v", l, err)
	}
}

func tagList(l []store.TemplateTag) string {
	out := ""
	for _, t := range l {
		out += t.Tag + "=" + t.BuildID + " "
	}
	return out
}

// testDeleteBuilds: a template's builds, their logs and its tags go; other
// templates' stay. A build created again under a deleted ID starts with an
// empty log (no entry of the old one is left behind).
func testDeleteBuilds(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, b := range []store.Build{build("d1", "py"), build("d2", "py"), build("k1", "node")} {
		if err := s.CreateBuild(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendBuildLogs(ctx, b.ID, store.BuildLog{Level: "info", Message: "from " + b.ID}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTag(ctx, store.TemplateTag{Template: b.Template, Tag: "t-" + b.ID, BuildID: b.ID}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteBuilds(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListBuilds(ctx, "py"); err != nil || len(l) != 0 {
		t.Fatalf("builds after delete = %v %v", buildIDs(l), err)
	}
	if _, err := s.GetBuild(ctx, "d1"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted build = %v", err)
	}
	if _, err := s.BuildLogs(ctx, "d1", 0, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("logs of a deleted build = %v", err)
	}
	if l, err := s.ListTags(ctx, "py"); err != nil || len(l) != 0 {
		t.Fatalf("tags after delete = %s %v", tagList(l), err)
	}
	if l, _ := s.ListBuilds(ctx, "node"); buildIDs(l) != "k1 " {
		t.Fatalf("another template's builds = %s", buildIDs(l))
	}
	if l, _ := s.BuildLogs(ctx, "k1", 0, 0); len(l) != 1 || l[0].Message != "from k1" {
		t.Fatalf("another template's logs = %+v", l)
	}
	if l, _ := s.ListTags(ctx, "node"); tagList(l) != "t-k1=k1 " {
		t.Fatalf("another template's tags = %s", tagList(l))
	}
	if err := s.CreateBuild(ctx, build("d1", "py")); err != nil {
		t.Fatal(err)
	}
	if l, err := s.BuildLogs(ctx, "d1", 0, 0); err != nil || len(l) != 0 {
		t.Fatalf("a new build under a deleted ID has logs: %+v %v", l, err)
	}
	if err := s.DeleteBuilds(ctx, "never"); err != nil {
		t.Fatalf("delete of a template without builds = %v", err)
	}
}
