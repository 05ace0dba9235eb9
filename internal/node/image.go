package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envdclient"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/snapshot"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// ImageTemplateSpec describes a template built from an OCI image.
type ImageTemplateSpec struct {
	Name string
	// Ref is the image: "registry/repo:tag" or "registry/repo@sha256:...".
	Ref string
	// Registry says how to reach the registry (auth, platform, insecure).
	Registry oci.Options
	// Start, when set, is started through the daemon once it has the
	// image's defaults (so as the image's user, in its working directory,
	// with its env) and keeps running: it is in the template's snapshot,
	// running in every sandbox made from it.
	Start []string
	// Ready is run the same way, after Start, until it exits 0; then the
	// template is snapshotted. Empty: ready once the daemon answers (and
	// Start was started).
	Ready []string
	// ReadyTimeout bounds Ready's wait (default 60 s).
	ReadyTimeout time.Duration
}

// OCIStoreDir is where a node keeps unpacked images: inside its root
// filesystem directory, so that an image's root filesystem can be made of
// hard links to the shared tree (same filesystem, no data copied).
func OCIStoreDir(rootfsDir string) string { return filepath.Join(rootfsDir, ".oci") }

// imageBuilds counts the builds in progress per image root filesystem,
// so that a failed build removes the root filesystem it registered only
// when no other build uses it; while one is being removed, new builds of
// it wait (they would find it registered, then gone).
var imageBuilds = struct {
	sync.Mutex
	n        map[string]int
	removing map[string]chan struct{}
}{n: map[string]int{}, removing: map[string]chan struct{}{}}

// acquireImage counts a build of root filesystem name in.
func acquireImage(ctx context.Context, name string) error {
	for {
		imageBuilds.Lock()
		ch := imageBuilds.removing[name]
		if ch == nil {
			imageBuilds.n[name]++
			imageBuilds.Unlock()
			return nil
		}
		imageBuilds.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// releaseImage counts a build out; the last one out runs cleanup (nil:
// none) with new builds held off.
func releaseImage(name string, cleanup func()) {
	imageBuilds.Lock()
	imageBuilds.n[name]--
	if imageBuilds.n[name] > 0 || cleanup == nil {
		if imageBuilds.n[name] == 0 {
			delete(imageBuilds.n, name)
		}
		imageBuilds.Unlock()
		return
	}
	delete(imageBuilds.n, name)
	ch := make(chan struct{})
	imageBuilds.removing[name] = ch
	imageBuilds.Unlock()
	cleanup()
	imageBuilds.Lock()
	delete(imageBuilds.removing, name)
	imageBuilds.Unlock()
	close(ch)
}

// BuildImageTemplate pulls the image, registers its tree as a root
// filesystem (shared by every template of the same layers, see
// rootfs.RegisterImage) and builds the template: the in-sandbox daemon as
// init (bound at /opt/spore, as in the default templates), the image's
// Env as the sandbox's environment, its User as the default user of
// commands ("user", which Spore adds, when it names none) and its
// WorkingDir as their working directory (the user's home when it names
// none); then the start command, if any, and the ready check.
//
// Errors: a malformed reference or an unusable image configuration is
// errdefs.ErrInvalidArgument; an unknown image errdefs.ErrNotFound;
// refused credentials oci.ErrUnauthorized; an unreachable registry
// errdefs.ErrUnavailable. A failure leaves no template, and no root
// filesystem this call registered that nothing else uses.
func (n *Node) BuildImageTemplate(ctx context.Context, spec ImageTemplateSpec) (snapshot.Manifest, error) {
	if err := ids.ValidateName("template name", spec.Name); err != nil {
		return snapshot.Manifest{}, err
	}
	img, err := oci.Pull(ctx, spec.Ref, spec.Registry)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: image configuration: %w", spec.Name, errors.Join(errdefs.ErrUnavailable, err))
	}
	store := &oci.Store{Dir: OCIStoreDir(n.rootfsDir), Log: n.log}
	tree, err := store.Ensure(ctx, img)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	name := rootfs.ImageName(tree.Key)
	if err := acquireImage(ctx, name); err != nil {
		return snapshot.Manifest{}, err
	}
	created, ok := false, false
	defer func() {
		var cleanup func()
		if !ok && created {
			cleanup = func() {
				if n.rootfsInUse(name, rootfs.ImageID(tree.Key)) {
					return
				}
				if err := rootfs.Remove(n.rootfsDir, name); err != nil {
					n.log.Warn("remove root filesystem of a failed build", "rootfs", name, "err", err)
				}
			}
		}
		releaseImage(name, cleanup)
	}()
	_, _, created, err = rootfs.RegisterImage(ctx, n.rootfsDir, tree.Key, tree.Rootfs)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	ts, err := n.imageTemplateSpec(spec, name, cfg.Config.Env, cfg.Config.User, cfg.Config.WorkingDir)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("template %s from %s: %w", spec.Name, img.Ref, err)
	}
	m, err := n.Engine.BuildTemplate(ctx, ts)
	if err != nil {
		return snapshot.Manifest{}, err
	}
	ok = true
	n.log.Info("template built from image", "template_id", spec.Name, "ref", img.Ref, "rootfs", name, "key", tree.Key)
	return m, nil
}

// rootfsInUse reports whether a snapshot or sandbox depends on root
// filesystem name of build id.
func (n *Node) rootfsInUse(name, id string) bool {
	for _, m := range n.Engine.Snapshots().List() {
		if m.RootFSID == id {
			return true
		}
	}
	for _, sb := range n.Engine.List(context.Background()) {
		if sb.RootFS == name {
			return true
		}
	}
	return false
}

// imageTemplateSpec is the engine's template spec for an image registered
// as root filesystem name, with the image configuration's env, user and
// working directory.
func (n *Node) imageTemplateSpec(spec ImageTemplateSpec, name string, env []string, user, workdir string) (engine.TemplateSpec, error) {
	base := n.TemplateSpecs()[0]
	run := base.Run
	run.Env = nil
	hasPath := false
	vars := map[string]string{}
	for _, kv := range env {
		k, v, found := strings.Cut(kv, "=")
		if !found || k == "" {
			return engine.TemplateSpec{}, errdefs.Invalidf("image env %q is not KEY=value", kv)
		}
		hasPath = hasPath || k == "PATH"
		vars[k] = v
		run.Env = append(run.Env, kv)
	}
	if !hasPath {
		run.Env = append(run.Env, base.Run.Env...)
		for _, kv := range base.Run.Env {
			k, v, _ := strings.Cut(kv, "=")
			vars[k] = v
		}
	}
	root, err := os.OpenRoot(rootfs.Path(n.rootfsDir, name))
	if err != nil {
		return engine.TemplateSpec{}, err
	}
	defer root.Close()
	account, err := resolveUser(root, user)
	if err != nil {
		return engine.TemplateSpec{}, err
	}
	if workdir != "" {
		if !path.IsAbs(workdir) {
			return engine.TemplateSpec{}, errdefs.Invalidf("image working directory %q is not absolute", workdir)
		}
		// Resolved inside the tree (a link leaving it is refused).
		if fi, err := root.Stat(strings.TrimPrefix(path.Clean(workdir), "/")); err != nil || !fi.IsDir() {
			return engine.TemplateSpec{}, errdefs.Invalidf("image working directory %s is not a directory in the image", workdir)
		}
	}
	if spec.ReadyTimeout <= 0 {
		spec.ReadyTimeout = 60 * time.Second
	}
	init := envd.InitRequest{EnvVars: vars, DefaultUser: account, DefaultWorkdir: workdir}
	return engine.TemplateSpec{
		Name: spec.Name, RootFS: name, Run: run, Ready: []string{envdMountPoint + "/bin/spore-envd", "-health"},
		Prepare: func(ctx context.Context, addr netip.Addr) error {
			return n.prepareImage(ctx, addr, init, spec.Start, spec.Ready, spec.ReadyTimeout)
		},
	}, nil
}

// prepareImage gives the build instance's daemon the image's defaults
// (kept in its memory, so in the snapshot), then starts the start command
// and waits for the ready command through it, as E2B does.
func (n *Node) prepareImage(ctx context.Context, addr netip.Addr, init envd.InitRequest, start, ready []string, timeout time.Duration) error {
	if err := n.Envd.Init(ctx, addr, "", init); err != nil {
		return fmt.Errorf("daemon defaults: %w", err)
	}
	if len(start) == 0 && len(ready) == 0 {
		return nil
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	pc := processpbconnect.NewProcessClient(hc, envdclient.URL(addr, envd.Port))
	if len(start) > 0 {
		// The stream is left once the process started: the daemon keeps
		// it running.
		sctx, cancel := context.WithCancel(ctx)
		st, err := pc.Start(sctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: start[0], Args: start[1:]}}))
		if err == nil && !st.Receive() {
			err = st.Err()
			if err == nil {
				err = errors.New("no start event")
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("%w: start command %q: %v", errdefs.ErrInvalidArgument, start, err)
		}
	}
	if len(ready) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		code, out, err := runOnce(rctx, pc, ready)
		if err == nil && code == 0 {
			return nil
		}
		select {
		case <-rctx.Done():
			return fmt.Errorf("ready command %q did not pass within %v (last exit %d, %v): %s: %w", ready, timeout, code, err, out, errdefs.ErrUnavailable)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runOnce runs a command through the daemon and returns its exit code and
// the end of its output.
func runOnce(ctx context.Context, pc processpbconnect.ProcessClient, args []string) (int32, string, error) {
	st, err := pc.Start(ctx, connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: args[0], Args: args[1:]}}))
	if err != nil {
		return -1, "", err
	}
	defer st.Close()
	var out []byte
	code := int32(-1)
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out = append(out, d.GetStdout()...)
			out = append(out, d.GetStderr()...)
			if len(out) > 4096 {
				out = out[len(out)-4096:]
			}
		}
		if e := ev.GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	return code, string(out), st.Err()
}

// resolveUser turns an image's User ("name", "uid", "name:group",
// "uid:gid") into the account name the daemon runs commands as, looked up
// in the image's /etc/passwd. The daemon knows users by name and runs
// them with their account's groups: a group other than the account's
// primary one is refused rather than silently dropped.
func resolveUser(root *os.Root, user string) (string, error) {
	if user == "" {
		return rootfs.ImageUser, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	passwd, err := root.ReadFile("etc/passwd")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var name string
	var gid string
	sc := bufio.NewScanner(bytes.NewReader(passwd))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 {
			continue
		}
		if f[0] == u || f[2] == u {
			name, gid = f[0], f[3]
			if f[0] == u {
				break
			}
		}
	}
	if name == "" {
		return "", errdefs.Invalidf("image user %q has no account in the image's /etc/passwd (the sandbox's daemon runs commands as named accounts)", user)
	}
	if hasGroup {
		want := g
		if _, err := strconv.Atoi(g); err != nil { // a group name
			group, err := root.ReadFile("etc/group")
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return "", err
			}
			want = ""
			sc := bufio.NewScanner(bytes.NewReader(group))
			for sc.Scan() {
				if f := strings.Split(sc.Text(), ":"); len(f) >= 3 && f[0] == g {
					want = f[2]
					break
				}
			}
			if want == "" {
				return "", errdefs.Invalidf("image user %q: group %s is not in the image's /etc/group", user, g)
			}
		}
		if want != gid {
			return "", errdefs.Invalidf("image user %q: group %s is not the primary group (%s) of account %s", user, g, gid, name)
		}
	}
	return name, nil
}
