package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/snapshot"
)

// ImageTemplateSpec describes a template built from an OCI image.
type ImageTemplateSpec struct {
	Name string
	// Ref is the image: "registry/repo:tag" or "registry/repo@sha256:...".
	Ref string
	// Registry says how to reach the registry (auth, platform, insecure).
	Registry oci.Options
	// Ready is run in the sandbox (as root) until it exits 0; then the
	// daemon gets the image's defaults and the template is snapshotted.
	// Empty: the daemon's health check. A custom check replaces it.
	Ready        []string
	ReadyTimeout time.Duration
}

// OCIStoreDir is where a node keeps unpacked images: inside its root
// filesystem directory, so that an image's root filesystem can be made of
// hard links to the shared tree (same filesystem, no data copied).
func OCIStoreDir(rootfsDir string) string { return filepath.Join(rootfsDir, ".oci") }

// imageBuilds counts the builds in progress per image root filesystem, so
// a failed build removes the root filesystem it registered only when no
// other build is using it.
var imageBuilds = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// BuildImageTemplate pulls the image, registers its tree as a root
// filesystem (shared by every template of the same layers, see
// rootfs.RegisterImage) and builds the template: the in-sandbox daemon as
// init (bound at /opt/spore, as in the default templates), the image's
// Env as the sandbox's environment, its User as the default user of
// commands ("user", which Spore adds, when it names none) and its
// WorkingDir as their working directory (the user's home when it names
// none).
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
	imageBuilds.Lock()
	imageBuilds.n[name]++
	imageBuilds.Unlock()
	created := false
	ok := false
	defer func() {
		imageBuilds.Lock()
		imageBuilds.n[name]--
		last := imageBuilds.n[name] == 0
		if last {
			delete(imageBuilds.n, name)
		}
		imageBuilds.Unlock()
		if !ok && created && last && !n.rootfsInUse(rootfs.ImageID(tree.Key)) {
			if err := rootfs.Remove(n.rootfsDir, name); err != nil {
				n.log.Warn("remove root filesystem of a failed build", "rootfs", name, "err", err)
			}
		}
	}()
	name, _, created, err = rootfs.RegisterImage(ctx, n.rootfsDir, tree.Key, tree.Rootfs)
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
// filesystem build id.
func (n *Node) rootfsInUse(id string) bool {
	for _, m := range n.Engine.Snapshots().List() {
		if m.RootFSID == id {
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
	ready := []string{envdMountPoint + "/bin/spore-envd", "-health"}
	ts := engine.TemplateSpec{
		Name: spec.Name, RootFS: name, Run: run, Ready: ready, ReadyTimeout: spec.ReadyTimeout,
		DaemonInit: &envd.InitRequest{EnvVars: vars, DefaultUser: account, DefaultWorkdir: workdir},
	}
	if len(spec.Ready) > 0 {
		ts.Ready = spec.Ready
	}
	return ts, nil
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
