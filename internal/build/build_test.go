package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// fakePlatform keeps snapshots as the list of things done to reach them.
type fakePlatform struct {
	mu      sync.Mutex
	snaps   map[string][]string // name -> history
	ids     map[string]string   // name -> snapshot ID
	n       int
	ran     []string // every command run, in order
	images  int
	started []string // refs sandboxes started from
	killed  int
	live    int
	failOn  string // a RUN script that exits 1
	block   string // a RUN script that runs until its ctx ends
	// scripted are the runs of a command, in turn (the last one repeats),
	// and startExits how a background command ends (none: it runs on).
	scripted   map[string][]fakeRun
	startExits map[string]Exit
	sizes      []Size // of the sandboxes started
	files      map[string]string
	templates  map[string]string

	resolvedCache int // cache entries looked up through Resolve (should be none)
}

func newFake() *fakePlatform {
	return &fakePlatform{snaps: map[string][]string{"base": nil}, ids: map[string]string{"base": "s-base"},
		files: map[string]string{}, templates: map[string]string{}, scripted: map[string][]fakeRun{}, startExits: map[string]Exit{}}
}

func (f *fakePlatform) ImageBase(_ context.Context, ref string, _ *Registry, force bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := "image-" + strings.NewReplacer(":", "-", "/", "-").Replace(ref)
	if _, ok := f.snaps[name]; !ok || force {
		f.images++
		f.n++
		f.snaps[name], f.ids[name] = []string{"image " + ref}, fmt.Sprintf("s%d", f.n)
	}
	return name, nil
}

func (f *fakePlatform) Resolve(_ context.Context, _, ref string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(ref, CachePrefix) {
		// Cache entries are the build's own rows: a lookup through
		// Resolve would ask every node on each miss.
		f.resolvedCache++
	}
	if id, ok := f.ids[ref]; ok {
		return id, nil
	}
	return "", errdefs.NotFoundf("%s", ref)
}

func (f *fakePlatform) Cached(_ context.Context, _, name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !strings.HasPrefix(name, CachePrefix) {
		return "", errdefs.Invalidf("Cached(%q): not a cache entry", name)
	}
	if id, ok := f.ids[name]; ok {
		return id, nil
	}
	return "", errdefs.NotFoundf("%s", name)
}

func (f *fakePlatform) Start(_ context.Context, ref string, size Size) (Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.snaps[ref]
	if !ok {
		return nil, errdefs.NotFoundf("%s", ref)
	}
	f.started = append(f.started, ref)
	f.sizes = append(f.sizes, size)
	f.live++
	return &fakeSandbox{f: f, id: fmt.Sprintf("sb%d", len(f.started)), hist: slices.Clone(h)}, nil
}

func (f *fakePlatform) Snapshot(_ context.Context, id, name string, template bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.snaps[name]; ok && !template {
		return "", errdefs.ErrAlreadyExists
	}
	return "", errors.New("snapshot needs the sandbox: use fakeSandbox")
}

func (f *fakePlatform) DeleteSnapshot(_ context.Context, _, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.snaps[ref]; !ok {
		return errdefs.NotFoundf("%s", ref)
	}
	delete(f.snaps, ref)
	delete(f.ids, ref)
	return nil
}

func (f *fakePlatform) Kill(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed++
	f.live--
	return nil
}

func (f *fakePlatform) Files(_ context.Context, _, hash string) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.files[hash]
	if !ok {
		return nil, errdefs.NotFoundf("files %s", hash)
	}
	return io.NopCloser(strings.NewReader(c)), nil
}

type fakeSandbox struct {
	f    *fakePlatform
	id   string
	hist []string
}

func (s *fakeSandbox) ID() string { return s.id }
func (s *fakeSandbox) Run(ctx context.Context, argv []string, user string, out func(string)) (int, error) {
	cmd := argv[len(argv)-1]
	if s.f.block != "" && cmd == s.f.block {
		<-ctx.Done()
		return -1, ctx.Err()
	}
	if strings.Contains(argv[0], "spore-envd") {
		cmd = strings.Join(argv[1:], " ")
	}
	s.f.mu.Lock()
	s.f.ran = append(s.f.ran, cmd)
	fail := s.f.failOn != "" && cmd == s.f.failOn
	runs, scripted := s.f.scripted[cmd]
	if len(runs) > 1 {
		s.f.scripted[cmd] = runs[1:]
	}
	s.f.mu.Unlock()
	if scripted {
		s.hist = append(s.hist, "run "+user+" "+cmd)
		for _, l := range runs[0].out {
			out(l)
		}
		return runs[0].code, nil
	}
	if cmd == "pwd" {
		out("/wd")
		return 0, nil
	}
	s.hist = append(s.hist, "run "+user+" "+cmd)
	out("ran " + cmd)
	if fail {
		out("boom")
		return 1, nil
	}
	return 0, nil
}
func (s *fakeSandbox) Background(_ context.Context, argv []string, _ string) (<-chan Exit, error) {
	cmd := argv[len(argv)-1]
	s.hist = append(s.hist, "start "+cmd)
	exited := make(chan Exit, 1)
	s.f.mu.Lock()
	if ex, ok := s.f.startExits[cmd]; ok {
		exited <- ex
	}
	s.f.mu.Unlock()
	return exited, nil
}

// fakeRun is one scripted run of a command: its output lines and exit code.
type fakeRun struct {
	out  []string
	code int
}

func (s *fakeSandbox) WriteFile(_ context.Context, p string, r io.Reader) error {
	b, _ := io.ReadAll(r)
	s.hist = append(s.hist, "write "+p+" "+string(b))
	return nil
}
func (s *fakeSandbox) Remove(context.Context, string) error { return nil }
func (s *fakeSandbox) Env(context.Context) (map[string]string, error) {
	return map[string]string{"PATH": "/bin"}, nil
}
func (s *fakeSandbox) MakeDir(_ context.Context, p string) error {
	s.hist = append(s.hist, "mkdir "+p)
	return nil
}
func (s *fakeSandbox) Init(_ context.Context, env map[string]string, user, workdir string) error {
	keys := make([]string, 0, len(env))
	for k, v := range env {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	s.hist = append(s.hist, fmt.Sprintf("init %v %s %s", keys, user, workdir))
	return nil
}

// snapPlatform routes Snapshot to the sandbox's history.
type snapPlatform struct {
	*fakePlatform
	sandboxes map[string]*fakeSandbox
}

func (p *snapPlatform) Start(ctx context.Context, _, ref string, size Size) (Sandbox, error) {
	sb, err := p.fakePlatform.Start(ctx, ref, size)
	if err == nil {
		p.mu.Lock()
		p.sandboxes[sb.ID()] = sb.(*fakeSandbox)
		p.mu.Unlock()
	}
	return sb, err
}

func (p *snapPlatform) Snapshot(_ context.Context, id, name string, template bool) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.snaps[name]; ok && !template {
		return "", errdefs.ErrAlreadyExists
	}
	p.n++
	sid := fmt.Sprintf("s%d", p.n)
	p.snaps[name], p.ids[name] = slices.Clone(p.sandboxes[id].hist), sid
	if template {
		p.templates[name] = sid
	}
	return sid, nil
}

func newBuilder() (*Builder, *snapPlatform) {
	p := &snapPlatform{fakePlatform: newFake(), sandboxes: map[string]*fakeSandbox{}}
	return &Builder{P: p}, p
}

func spec3() Spec {
	return Spec{FromImage: "reg/app:1", Steps: []Step{
		{Type: StepRun, Args: []string{"echo one"}},
		{Type: StepEnv, Args: []string{"A", "1:$PATH"}},
		{Type: StepRun, Args: []string{"echo three", "root"}},
	}, StartCmd: "server", ReadyCmd: "check"}
}

func run(t *testing.T, b *Builder, name string, s Spec) (string, []Log, error) {
	t.Helper()
	var logs []Log
	r, err := b.Build(context.Background(), Job{Name: name, Spec: s}, func(l Log) { logs = append(logs, l) })
	if err == nil && r.Build == "" {
		t.Fatal("no build snapshot")
	}
	return r.Template, logs, err
}

func TestBuildRunsStepsInOrderAndSnapshotsTheTemplate(t *testing.T) {
	b, p := newBuilder()
	id, logs, err := run(t, b, "app", spec3())
	if err != nil {
		t.Fatal(err)
	}
	if p.templates["app"] != id {
		t.Fatalf("template app = %q, built %q", p.templates["app"], id)
	}
	want := []string{"image reg/app:1", "run  echo one", "init [A=1:/bin]  ", "run root echo three", "start server", "run  check"}
	if got := p.snaps["app"]; !slices.Equal(got, want) {
		t.Fatalf("template history\n got %q\nwant %q", got, want)
	}
	if p.live != 0 {
		t.Fatalf("%d build sandboxes left running", p.live)
	}
	// Logs name their steps the way the SDK counts them.
	steps := map[string]bool{}
	for _, l := range logs {
		steps[l.Step] = true
	}
	for _, s := range []string{StepBase, "1", "2", "3", StepFinalize} {
		if !steps[s] {
			t.Errorf("no log for step %q", s)
		}
	}
}

func TestRebuildIsACacheHit(t *testing.T) {
	b, p := newBuilder()
	if _, _, err := run(t, b, "app", spec3()); err != nil {
		t.Fatal(err)
	}
	ran := len(p.ran)
	if _, _, err := run(t, b, "app", spec3()); err != nil {
		t.Fatal(err)
	}
	if len(p.ran) != ran {
		t.Fatalf("a rebuild ran %q", p.ran[ran:])
	}
	if last := p.started[len(p.started)-1]; !strings.HasPrefix(last, CachePrefix) {
		t.Fatalf("rebuild started from %q, not the cache", last)
	}
	if p.images != 1 {
		t.Fatalf("image base made %d times", p.images)
	}
	if p.resolvedCache != 0 {
		t.Fatalf("%d cache lookups went through Resolve (which asks every node on a miss), not Cached", p.resolvedCache)
	}
	want := []string{"image reg/app:1", "run  echo one", "init [A=1:/bin]  ", "run root echo three", "start server", "run  check"}
	if got := p.snaps["app"]; !slices.Equal(got, want) {
		t.Fatalf("template history\n got %q\nwant %q", got, want)
	}
}

func TestChangedStepRerunsFromThere(t *testing.T) {
	b, p := newBuilder()
	if _, _, err := run(t, b, "app", spec3()); err != nil {
		t.Fatal(err)
	}
	s := spec3()
	s.Steps[2].Args = []string{"echo THREE", "root"}
	ran := len(p.ran)
	if _, _, err := run(t, b, "app", s); err != nil {
		t.Fatal(err)
	}
	if got, want := p.ran[ran:], []string{"echo THREE", "check"}; !slices.Equal(got, want) {
		t.Fatalf("rebuild ran %q, want %q", got, want)
	}
	want := []string{"image reg/app:1", "run  echo one", "init [A=1:/bin]  ", "run root echo THREE", "start server", "run  check"}
	if got := p.snaps["app"]; !slices.Equal(got, want) {
		t.Fatalf("template history\n got %q\nwant %q", got, want)
	}
	// A changed start command reruns only the finalize step.
	s.StartCmd = "server2"
	ran = len(p.ran)
	if _, _, err := run(t, b, "app", s); err != nil {
		t.Fatal(err)
	}
	if got, want := p.ran[ran:], []string{"check"}; !slices.Equal(got, want) {
		t.Fatalf("rebuild ran %q, want %q", got, want)
	}
}

func TestForcedStepAndForcedBuild(t *testing.T) {
	b, p := newBuilder()
	if _, _, err := run(t, b, "app", spec3()); err != nil {
		t.Fatal(err)
	}
	s := spec3()
	s.Steps[1].Force = true // skipCache before step 2: 2 and 3 rerun
	ran := len(p.ran)
	if _, _, err := run(t, b, "app", s); err != nil {
		t.Fatal(err)
	}
	if got, want := p.ran[ran:], []string{"echo three", "check"}; !slices.Equal(got, want) {
		t.Fatalf("forced rebuild ran %q, want %q", got, want)
	}
	s = spec3()
	s.Force = true
	ran, images := len(p.ran), p.images
	if _, _, err := run(t, b, "app", s); err != nil {
		t.Fatal(err)
	}
	if got, want := p.ran[ran:], []string{"echo one", "echo three", "check"}; !slices.Equal(got, want) {
		t.Fatalf("forced build ran %q, want %q", got, want)
	}
	if p.images != images+1 {
		t.Fatal("a forced build did not make the image base again")
	}
}

func TestFailingStepNamesItself(t *testing.T) {
	b, p := newBuilder()
	p.failOn = "echo three"
	_, logs, err := run(t, b, "app", spec3())
	var se *StepError
	if !errors.As(err, &se) || se.Step != "3" || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v (%T), want a StepError at step 3", err, err)
	}
	if !strings.Contains(err.Error(), "exited 1") || !strings.Contains(err.Error(), "echo three") {
		t.Fatalf("err = %v", err)
	}
	if _, ok := p.templates["app"]; ok {
		t.Fatal("a failed build made the template")
	}
	if p.live != 0 {
		t.Fatal("a failed build left its sandbox")
	}
	seen := false
	for _, l := range logs {
		seen = seen || (l.Step == "3" && l.Message == "boom")
	}
	if !seen {
		t.Fatal("the failing command's output is not in the log")
	}
	// The steps before it were cached: the fixed build reruns only step 3.
	p.failOn = ""
	ran := len(p.ran)
	if _, _, err := run(t, b, "app", spec3()); err != nil {
		t.Fatal(err)
	}
	if got, want := p.ran[ran:], []string{"echo three", "check"}; !slices.Equal(got, want) {
		t.Fatalf("rebuild ran %q, want %q", got, want)
	}
}

func TestCopyAndWorkdirAndUser(t *testing.T) {
	b, p := newBuilder()
	h := strings.Repeat("ab", 32)
	p.files[h] = "TAR"
	s := Spec{FromTemplate: "base", Steps: []Step{
		{Type: StepWorkdir, Args: []string{"app"}},
		{Type: StepCopy, Args: []string{"src", "dest/", "user", "0755"}, FilesHash: h},
		{Type: StepUser, Args: []string{"user"}},
	}}
	if _, _, err := run(t, b, "t", s); err != nil {
		t.Fatal(err)
	}
	want := []string{"mkdir /wd/app", "init []  /wd/app", "write /tmp/.spore-copy-" + h + " TAR",
		"run root -copy -archive /tmp/.spore-copy-" + h + " -src src -dest dest/ -user user -mode 0755", "init [] user "}
	if got := p.snaps["t"]; !slices.Equal(got, want) {
		t.Fatalf("history\n got %q\nwant %q", got, want)
	}
	// A copy of files never uploaded fails at its step.
	s.Steps[1].FilesHash = strings.Repeat("cd", 32)
	_, _, err := run(t, b, "t2", s)
	var se *StepError
	if !errors.As(err, &se) || se.Step != "2" || !errdefs.IsNotFound(err) {
		t.Fatalf("err = %v", err)
	}
}

func TestValidateRefusesBadSpecs(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for name, s := range map[string]Spec{
		"no base":        {},
		"two bases":      {FromImage: "a", FromTemplate: "b"},
		"unknown step":   {FromTemplate: "base", Steps: []Step{{Type: "ADD", Args: []string{"x"}}}},
		"traversal":      {FromTemplate: "base", Steps: []Step{{Type: StepCopy, Args: []string{"../etc", "/x"}, FilesHash: h}}},
		"absolute src":   {FromTemplate: "base", Steps: []Step{{Type: StepCopy, Args: []string{"/etc", "/x"}, FilesHash: h}}},
		"bad hash":       {FromTemplate: "base", Steps: []Step{{Type: StepCopy, Args: []string{"a", "/x"}, FilesHash: "zz"}}},
		"bad mode":       {FromTemplate: "base", Steps: []Step{{Type: StepCopy, Args: []string{"a", "/x", "", "999"}, FilesHash: h}}},
		"odd env":        {FromTemplate: "base", Steps: []Step{{Type: StepEnv, Args: []string{"A"}}}},
		"bad env name":   {FromTemplate: "base", Steps: []Step{{Type: StepEnv, Args: []string{"A=B", "1"}}}},
		"bad user":       {FromTemplate: "base", Steps: []Step{{Type: StepUser, Args: []string{"a b"}}}},
		"empty run":      {FromTemplate: "base", Steps: []Step{{Type: StepRun, Args: []string{" "}}}},
		"aws registry":   {FromImage: "x", FromImageRegistry: &Registry{Type: "aws"}},
		"gcp, no key":    {FromImage: "x", FromImageRegistry: &Registry{Type: "gcp"}},
		"gcp, not JSON":  {FromImage: "x", FromImageRegistry: &Registry{Type: "gcp", ServiceAccountJSON: "key.json"}},
		"gcp, no email":  {FromImage: "x", FromImageRegistry: &Registry{Type: "gcp", ServiceAccountJSON: `{"private_key":"k"}`}},
		"gcp, no image":  {FromTemplate: "base", FromImageRegistry: &Registry{Type: "gcp", ServiceAccountJSON: gcpKey("a@p.iam")}},
		"half creds":     {FromImage: "x", FromImageRegistry: &Registry{Type: "registry", Username: "u"}},
		"too many steps": {FromTemplate: "base", Steps: make([]Step, MaxSteps+1)},
	} {
		if err := s.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	b, p := newBuilder()
	if _, _, err := run(t, b, "x", Spec{}); !errdefs.IsInvalidArgument(err) || len(p.started) != 0 {
		t.Fatalf("a bad spec: err = %v, %d sandboxes started", err, len(p.started))
	}
}

func gcpKey(email string) string {
	return `{"type":"service_account","client_email":"` + email + `","private_key":"-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n"}`
}

// TestRegistryCredentials: the credentials a build's fromImageRegistry
// gives the node are those the stock SDK sent and nothing else: fromImage's
// username and password as they are, fromGCPRegistry's service account
// key as Google's "_json_key" basic credentials, none without a registry.
// The image base is kept per reference and identity: one per user name or
// service account, the same without credentials as before.
func TestRegistryCredentials(t *testing.T) {
	basic := &Registry{Type: "registry", Username: "u", Password: "p"}
	gcpA := &Registry{Type: "gcp", ServiceAccountJSON: gcpKey("a@p.iam.gserviceaccount.com")}
	gcpB := &Registry{Type: "gcp", ServiceAccountJSON: gcpKey("b@p.iam.gserviceaccount.com")}
	for _, r := range []*Registry{basic, gcpA} {
		if err := (Spec{FromImage: "europe-docker.pkg.dev/p/r/app:1", FromImageRegistry: r}).Validate(); err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	for _, c := range []struct {
		reg        *Registry
		user, pass string
	}{{nil, "", ""}, {basic, "u", "p"}, {gcpA, "_json_key", gcpA.ServiceAccountJSON}} {
		if u, p := c.reg.Credentials(); u != c.user || p != c.pass {
			t.Errorf("%+v: credentials %q %q, want %q %q", c.reg, u, p, c.user, c.pass)
		}
	}
	ref := "europe-docker.pkg.dev/p/r/app:1"
	names := map[string]bool{}
	for _, r := range []*Registry{nil, basic, gcpA, gcpB} {
		names[ImageName(ref, r)] = true
	}
	if len(names) != 4 {
		t.Fatalf("image bases %v: want one per identity", names)
	}
	if ImageName(ref, gcpA) != ImageName(ref, &Registry{Type: "gcp", ServiceAccountJSON: gcpKey("a@p.iam.gserviceaccount.com")}) {
		t.Fatal("one service account, two image bases")
	}
	if ImageName(ref, nil) != "image-"+key(ref, "")[:16] || ImageName(ref, basic) != "image-"+key(ref, "u")[:16] {
		t.Fatal("the image bases of builds without credentials or with a user name moved: their cache is lost")
	}
}
