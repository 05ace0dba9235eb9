package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// DefaultTag is the tag a build gets when it names none (E2B's).
const DefaultTag = "default"

// Defaults of a Service.
const (
	DefaultTimeout   = time.Hour
	DefaultMaxUpload = 1 << 30
	// staleAfter: a build whose replica wrote nothing for this long
	// (it heartbeats every heartbeatEvery) is one whose replica stopped.
	staleAfter     = 2 * time.Minute
	heartbeatEvery = 15 * time.Second
	maxLogsPerPoll = 1000
)

// staleClock is the clock stale builds are judged by (tests move it).
var staleClock = time.Now

var tagRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Service is the template builds of one API replica: builds and tags are
// rows of the store (any replica answers their status), a build runs on
// the replica that started it, uploaded files are in the blob store.
type Service struct {
	St      store.Store
	Blobs   blob.Store // nil: uploads are refused
	Builder *Builder
	Holder  string // this replica, in a build's Owner
	Log     *slog.Logger
	// Timeout bounds one build (DefaultTimeout); MaxUpload one archive.
	Timeout   time.Duration
	MaxUpload int64

	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (s *Service) init() {
	s.once.Do(func() {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		if s.Log == nil {
			s.Log = slog.Default()
		}
		if s.Timeout <= 0 {
			s.Timeout = DefaultTimeout
		}
		if s.MaxUpload <= 0 {
			s.MaxUpload = DefaultMaxUpload
		}
	})
}

// Close stops the builds running here (they end in error) and waits.
func (s *Service) Close() {
	s.init()
	s.cancel()
	s.wg.Wait()
}

// SplitName splits E2B's "name:tag" (tag "" when none) and checks both.
func SplitName(ref string) (name, tag string, err error) {
	name, tag, _ = strings.Cut(ref, ":")
	if err := ids.ValidateName("template name", name); err != nil {
		return "", "", err
	}
	if tag != "" && !tagRE.MatchString(tag) {
		return "", "", errdefs.Invalidf("tag %q is malformed: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit", tag)
	}
	return name, tag, nil
}

func checkTags(tags []string) error {
	if len(tags) > 64 {
		return errdefs.Invalidf("%d tags; at most 64", len(tags))
	}
	for _, t := range tags {
		if !tagRE.MatchString(t) {
			return errdefs.Invalidf("tag %q is malformed: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit", t)
		}
	}
	return nil
}

// newBuildID is a random UUID (E2B's build IDs are UUIDs).
func newBuildID() string { return uuid.NewString() }

// Request records a build of nameTag ("name" or "name:tag") waiting for
// its spec (E2B's POST /v3/templates). With no tag at all it will get
// DefaultTag.
func (s *Service) Request(ctx context.Context, team, nameTag string, tags []string, cpu, memMB int) (store.Build, error) {
	name, tag, err := SplitName(nameTag)
	if err != nil {
		return store.Build{}, err
	}
	if err := checkTags(tags); err != nil {
		return store.Build{}, err
	}
	if tag != "" {
		tags = append([]string{tag}, tags...)
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag}
	}
	slices.Sort(tags)
	b := store.Build{ID: newBuildID(), TeamID: team, Template: name, Status: store.BuildWaiting, Tags: slices.Compact(tags), CPUCount: cpu, MemoryMB: memMB}
	if err := s.St.CreateBuild(ctx, b); err != nil {
		return store.Build{}, err
	}
	return s.St.GetBuild(ctx, b.ID)
}

// Get returns template's build id.
func (s *Service) Get(ctx context.Context, template, id string) (store.Build, error) {
	b, err := s.St.GetBuild(ctx, id)
	if err != nil {
		return store.Build{}, err
	}
	if b.Template != template {
		return store.Build{}, errdefs.NotFoundf("build %s of template %s", id, template)
	}
	return b, nil
}

// FilesPresent says whether the files of hash were uploaded (E2B's
// upload-link lookup).
func (s *Service) FilesPresent(ctx context.Context, hash string) (bool, error) {
	if !ValidHash(hash) {
		return false, errdefs.Invalidf("files hash %q is not a SHA-256 in hex", hash)
	}
	if s.Blobs == nil {
		return false, fmt.Errorf("%w: this server has no blob store for uploaded files (start it with --blob-store)", errdefs.ErrConflict)
	}
	_, err := s.Blobs.Stat(ctx, FilesKey(hash))
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// PutFiles stores the archive of the files of hash: size bytes of r
// (size must be known, at most MaxUpload). Files already there are never
// replaced (ErrAlreadyExists): a hash names its files for every build
// that uses it, so an upload cannot change what another build copies.
func (s *Service) PutFiles(ctx context.Context, hash string, r io.Reader, size int64) error {
	s.init()
	present, err := s.FilesPresent(ctx, hash)
	if err != nil {
		return err
	}
	if present {
		return fmt.Errorf("%w: the files of %s were uploaded already", errdefs.ErrAlreadyExists, hash)
	}
	switch {
	case size < 0:
		return errdefs.Invalidf("an upload needs its Content-Length")
	case size > s.MaxUpload:
		return fmt.Errorf("%w: the archive is %d bytes; at most %d", errdefs.ErrResourceLimit, size, s.MaxUpload)
	}
	return s.Blobs.Put(ctx, FilesKey(hash), r, size)
}

// Start starts template's waiting build id with spec (E2B's POST
// /v2/templates/{templateID}/builds/{buildID}); it runs in the
// background on this replica.
func (s *Service) Start(ctx context.Context, template, id string, spec Spec) error {
	s.init()
	if err := spec.Validate(); err != nil {
		return err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if len(raw) > maxSpecSize {
		return errdefs.Invalidf("the build spec is over %d bytes", maxSpecSize)
	}
	b, err := s.St.UpdateBuild(ctx, id, func(b *store.Build) error {
		switch {
		case b.Template != template:
			return errdefs.NotFoundf("build %s of template %s", id, template)
		case b.Status != store.BuildWaiting:
			return errdefs.Conflictf("build %s was started already (%s)", id, b.Status)
		}
		b.Status, b.Owner, b.Spec = store.BuildBuilding, s.Holder, raw
		return nil
	})
	if err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(b, spec)
	}()
	return nil
}

// run runs a build and records its logs, result and tags.
func (s *Service) run(b store.Build, spec Spec) {
	ctx, cancel := context.WithTimeout(s.ctx, s.Timeout)
	defer cancel()
	logs := &logSink{st: s.St, id: b.ID, log: s.Log}
	stop := logs.start(ctx)
	logs.add(Log{Time: time.Now(), Level: "info", Step: StepBase, Message: fmt.Sprintf("building template %s (build %s)", b.Template, b.ID)})
	res, err := s.Builder.Build(ctx, Job{Team: b.TeamID, Name: b.Template, Spec: spec, Size: Size{CPUCount: b.CPUCount, MemoryMB: b.MemoryMB}}, logs.add)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && s.ctx.Err() == nil {
		err = &StepError{Step: stepOf(err), Err: fmt.Errorf("%w: the build did not finish within %v", errdefs.ErrUnavailable, s.Timeout)}
	}
	if err != nil {
		logs.add(Log{Time: time.Now(), Level: "error", Step: stepOf(err), Message: err.Error()})
	}
	stop()
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer wcancel()
	if err == nil {
		for _, t := range b.Tags {
			if terr := s.St.SetTag(wctx, store.TemplateTag{Template: b.Template, Tag: t, BuildID: b.ID}); terr != nil {
				err = &StepError{Step: StepFinalize, Err: fmt.Errorf("tag %s: %w", t, terr)}
				break
			}
		}
	}
	_, uerr := s.St.UpdateBuild(wctx, b.ID, func(x *store.Build) error {
		if err != nil {
			x.Status, x.Reason, x.FailedStep = store.BuildError, err.Error(), stepOf(err)
			if s.ctx.Err() != nil {
				x.Reason = "the API replica running the build stopped: " + x.Reason
			}
		} else {
			x.Status, x.SnapshotID = store.BuildReady, res.Build
		}
		return nil
	})
	if uerr != nil {
		s.Log.Error("record a build's end", "build_id", b.ID, "err", uerr)
	}
	s.Log.Info("template build ended", "template_id", b.Template, "build_id", b.ID, "err", err)
}

func stepOf(err error) string {
	var se *StepError
	if errors.As(err, &se) {
		return se.Step
	}
	return StepFinalize
}

// Status returns template's build id with its log entries from offset
// (E2B's build status). A build left building by a replica that stopped
// heartbeating is ended in error here.
func (s *Service) Status(ctx context.Context, template, id string, offset int) (store.Build, []store.BuildLog, error) {
	b, err := s.Get(ctx, template, id)
	if err != nil {
		return store.Build{}, nil, err
	}
	if b.Status == store.BuildBuilding && staleClock().Sub(b.UpdatedAt) > staleAfter {
		b, err = s.St.UpdateBuild(ctx, id, func(x *store.Build) error {
			if x.Status == store.BuildBuilding && staleClock().Sub(x.UpdatedAt) > staleAfter {
				x.Status, x.Reason = store.BuildError, fmt.Sprintf("the API replica running the build (%s) stopped answering", x.Owner)
			}
			return nil
		})
		if err != nil {
			return store.Build{}, nil, err
		}
	}
	if offset < 0 {
		return store.Build{}, nil, errdefs.Invalidf("logsOffset %d is negative", offset)
	}
	logs, err := s.St.BuildLogs(ctx, id, offset, maxLogsPerPoll)
	if err != nil {
		return store.Build{}, nil, err
	}
	return b, logs, nil
}

// ResolveTag returns the snapshot of template name's build tagged tag.
func (s *Service) ResolveTag(ctx context.Context, name, tag string) (string, error) {
	t, err := s.St.GetTag(ctx, name, tag)
	if err != nil {
		return "", err
	}
	b, err := s.St.GetBuild(ctx, t.BuildID)
	if err != nil {
		return "", err
	}
	if b.SnapshotID == "" {
		return "", errdefs.NotFoundf("template %s:%s has no built snapshot", name, tag)
	}
	return b.SnapshotID, nil
}

// AssignTags gives tags to the build target ("name:tag", tag default
// DefaultTag) names; it returns that build's ID.
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (string, error) {
	name, tag, err := SplitName(target)
	if err != nil {
		return "", err
	}
	if len(tags) == 0 {
		return "", errdefs.Invalidf("no tags to assign")
	}
	if err := checkTags(tags); err != nil {
		return "", err
	}
	if tag == "" {
		tag = DefaultTag
	}
	t, err := s.St.GetTag(ctx, name, tag)
	if err != nil {
		return "", err
	}
	for _, nt := range tags {
		if err := s.St.SetTag(ctx, store.TemplateTag{Template: name, Tag: nt, BuildID: t.BuildID}); err != nil {
			return "", err
		}
	}
	return t.BuildID, nil
}

// RemoveTags removes tags of template name; all must exist (nothing is
// removed otherwise).
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
	if err := ids.ValidateName("template name", name); err != nil {
		return err
	}
	if len(tags) == 0 {
		return errdefs.Invalidf("no tags to remove")
	}
	if err := checkTags(tags); err != nil {
		return err
	}
	for _, t := range tags {
		if _, err := s.St.GetTag(ctx, name, t); err != nil {
			return err
		}
	}
	for _, t := range tags {
		if err := s.St.DeleteTag(ctx, name, t); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// logSink batches a build's log entries into the store (every 250 ms),
// and heartbeats the build's row so other replicas see it alive.
type logSink struct {
	st  store.Store
	id  string
	log *slog.Logger

	mu      sync.Mutex
	pending []store.BuildLog
}

func (l *logSink) add(e Log) {
	l.mu.Lock()
	l.pending = append(l.pending, store.BuildLog{Time: e.Time.UTC(), Level: e.Level, Message: e.Message, Step: e.Step})
	l.mu.Unlock()
}

func (l *logSink) flush(ctx context.Context) {
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if err := l.st.AppendBuildLogs(ctx, l.id, batch...); err != nil {
		l.log.Warn("append build logs", "build_id", l.id, "err", err)
	}
}

// start flushes and heartbeats until the returned stop, which flushes
// what is left.
func (l *logSink) start(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			l.flush(ctx)
			if time.Since(last) > heartbeatEvery {
				last = time.Now()
				if _, err := l.st.UpdateBuild(ctx, l.id, func(*store.Build) error { return nil }); err != nil {
					l.log.Warn("build heartbeat", "build_id", l.id, "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		l.flush(fctx)
	}
}
