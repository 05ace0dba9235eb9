package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/sqlite"
)

func newService(t *testing.T) (*Service, *snapPlatform) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "spore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, p := newBuilder()
	s := &Service{St: st, Blobs: blobs, Builder: b, Holder: "r1"}
	t.Cleanup(s.Close)
	return s, p
}

// wait polls a build's status until it ends.
func wait(t *testing.T, s *Service, tpl, id string) (store.Build, []store.BuildLog) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var all []store.BuildLog
	for {
		b, logs, err := s.Status(context.Background(), tpl, id, len(all))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, logs...)
		if b.Finished() {
			// What was appended after the poll that saw the end.
			_, logs, _ = s.Status(context.Background(), tpl, id, len(all))
			return b, append(all, logs...)
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s still %s", id, b.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServiceBuildAndTags(t *testing.T) {
	s, p := newService(t)
	ctx := context.Background()
	b, err := s.Request(ctx, "", "app", nil, 2, 512)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != store.BuildWaiting || len(b.Tags) != 1 || b.Tags[0] != DefaultTag {
		t.Fatalf("requested build: %+v", b)
	}
	if err := s.Start(ctx, "app", b.ID, spec3()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, "app", b.ID, spec3()); !errdefs.IsConflict(err) {
		t.Fatalf("second start: %v, want Conflict", err)
	}
	done, logs := wait(t, s, "app", b.ID)
	if got := p.sizes[len(p.sizes)-1]; got != (Size{CPUCount: 2, MemoryMB: 512}) {
		t.Fatalf("build sandbox size %+v, want the request's", got)
	}
	if done.Status != store.BuildReady || done.SnapshotID == "" || done.SnapshotID == p.templates["app"] {
		t.Fatalf("build: %+v (template snapshot %s)", done, p.templates["app"])
	}
	if len(logs) == 0 || !strings.Contains(logs[len(logs)-1].Message, "template app is snapshot") {
		t.Fatalf("logs end with %+v", logs[len(logs)-1:])
	}
	snap, err := s.ResolveTag(ctx, "app", DefaultTag)
	if err != nil || snap != done.SnapshotID {
		t.Fatalf("app:default = %q, %v; want %s", snap, err, done.SnapshotID)
	}
	// A second build tagged v2 leaves default on the first.
	b2, _ := s.Request(ctx, "", "app:v2", nil, 0, 0)
	sp := spec3()
	sp.Steps[0].Args = []string{"echo ONE"}
	if err := s.Start(ctx, "app", b2.ID, sp); err != nil {
		t.Fatal(err)
	}
	if d, _ := wait(t, s, "app", b2.ID); d.Status != store.BuildReady {
		t.Fatalf("v2: %+v", d)
	}
	if id, err := s.AssignTags(ctx, "app:v2", []string{"prod"}); err != nil || id != b2.ID {
		t.Fatalf("assign: %s %v", id, err)
	}
	if snap, _ := s.ResolveTag(ctx, "app", DefaultTag); snap != done.SnapshotID {
		t.Fatal("default moved")
	}
	if err := s.RemoveTags(ctx, "app", []string{"prod", "nope"}); !errdefs.IsNotFound(err) {
		t.Fatalf("remove with one missing: %v", err)
	}
	if _, err := s.St.GetTag(ctx, "app", "prod"); err != nil {
		t.Fatal("a refused removal removed a tag")
	}
	for _, bad := range []string{"app:bad tag", "../x", ""} {
		if _, err := s.Request(ctx, "", bad, nil, 0, 0); !errdefs.IsInvalidArgument(err) {
			t.Errorf("request %q: %v", bad, err)
		}
	}
}

func TestServiceFailedBuildRecordsStep(t *testing.T) {
	s, p := newService(t)
	p.failOn = "echo three"
	ctx := context.Background()
	b, _ := s.Request(ctx, "", "app", nil, 0, 0)
	if err := s.Start(ctx, "app", b.ID, spec3()); err != nil {
		t.Fatal(err)
	}
	done, logs := wait(t, s, "app", b.ID)
	if done.Status != store.BuildError || done.FailedStep != "3" || !strings.Contains(done.Reason, "exited 1") {
		t.Fatalf("failed build: %+v", done)
	}
	last := logs[len(logs)-1]
	if last.Level != "error" || last.Step != "3" {
		t.Fatalf("last log %+v", last)
	}
	if _, err := s.St.GetTag(ctx, "app", DefaultTag); !errdefs.IsNotFound(err) {
		t.Fatal("a failed build was tagged")
	}
}

func TestServiceConcurrentBuilds(t *testing.T) {
	s, _ := newService(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	ids := make([]string, 6)
	for i := range ids {
		b, err := s.Request(ctx, "", fmt.Sprintf("app%d", i), nil, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = b.ID
	}
	for i, id := range ids {
		wg.Go(func() {
			if err := s.Start(ctx, fmt.Sprintf("app%d", i), id, spec3()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		if d, _ := wait(t, s, fmt.Sprintf("app%d", i), id); d.Status != store.BuildReady {
			t.Errorf("build %d: %+v", i, d)
		}
	}
}

func TestServiceTimeoutAndClose(t *testing.T) {
	s, p := newService(t)
	p.block = "sleep forever"
	s.Timeout = 300 * time.Millisecond
	ctx := context.Background()
	sp := Spec{FromTemplate: "base", Steps: []Step{{Type: StepRun, Args: []string{"sleep forever"}}}}
	b, _ := s.Request(ctx, "", "slow", nil, 0, 0)
	if err := s.Start(ctx, "slow", b.ID, sp); err != nil {
		t.Fatal(err)
	}
	done, _ := wait(t, s, "slow", b.ID)
	if done.Status != store.BuildError || !strings.Contains(done.Reason, "did not finish within") {
		t.Fatalf("timed-out build: %+v", done)
	}
	// A replica that stops ends its builds in error.
	s.Timeout = time.Hour
	b2, _ := s.Request(ctx, "", "slow", nil, 0, 0)
	if err := s.Start(ctx, "slow", b2.ID, sp); err != nil {
		t.Fatal(err)
	}
	s.Close()
	got, err := s.St.GetBuild(ctx, b2.ID)
	if err != nil || got.Status != store.BuildError || !strings.Contains(got.Reason, "stopped") {
		t.Fatalf("build of a closed service: %+v %v", got, err)
	}
	if p.live != 0 {
		t.Fatalf("%d build sandboxes left", p.live)
	}
}

func TestServiceStaleBuildEnds(t *testing.T) {
	s, _ := newService(t)
	ctx := context.Background()
	// A build another replica started and stopped heartbeating.
	b := store.Build{ID: "b-stale", Template: "app", Status: store.BuildBuilding, Owner: "gone"}
	if err := s.St.CreateBuild(ctx, b); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Status(ctx, "app", b.ID, 0)
	if err != nil || got.Status != store.BuildBuilding {
		t.Fatalf("fresh: %+v %v", got, err)
	}
	staleClock = func() time.Time { return time.Now().Add(staleAfter + time.Second) }
	defer func() { staleClock = time.Now }()
	got, _, err = s.Status(ctx, "app", b.ID, 0)
	if err != nil || got.Status != store.BuildError || !strings.Contains(got.Reason, "gone") {
		t.Fatalf("stale: %+v %v", got, err)
	}
	if _, _, err := s.Status(ctx, "other", b.ID, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("another template's build: %v", err)
	}
}

func TestServiceUploads(t *testing.T) {
	s, _ := newService(t)
	ctx := context.Background()
	h := strings.Repeat("ef", 32)
	if ok, err := s.FilesPresent(ctx, h); err != nil || ok {
		t.Fatalf("present before: %v %v", ok, err)
	}
	s.MaxUpload = 4
	if err := s.PutFiles(ctx, h, strings.NewReader("12345"), 5); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	if err := s.PutFiles(ctx, h, strings.NewReader("1234"), -1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("no length: %v", err)
	}
	if ok, _ := s.FilesPresent(ctx, h); ok {
		t.Fatal("a refused upload is present")
	}
	if err := s.PutFiles(ctx, h, strings.NewReader("1234"), 4); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.FilesPresent(ctx, h); !ok {
		t.Fatal("upload not present")
	}
	if err := s.PutFiles(ctx, h, strings.NewReader("evil"), 4); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second upload of a hash: %v, want AlreadyExists", err)
	}
	if rc, _ := s.Blobs.Get(ctx, FilesKey(h)); rc != nil {
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "1234" {
			t.Fatalf("the files of %s were replaced: %q", h, b)
		}
	}
	if _, err := s.FilesPresent(ctx, "../../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad hash: %v", err)
	}
}
