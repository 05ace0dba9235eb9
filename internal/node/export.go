package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"archive/tar"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/envd/export"
	"github.com/spore-run/spore/internal/envdclient"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/oci"
	"github.com/spore-run/spore/internal/rootfs"
	processpb "github.com/spore-run/spore/proto/gen/process"
	"github.com/spore-run/spore/proto/gen/process/processpbconnect"
)

// ExportSpec asks for a sandbox's filesystem as an OCI image.
type ExportSpec struct {
	SandboxID string
	// Ref is where to push: "registry/repo:tag". Exactly one of Ref,
	// LayoutDir and BlobKey.
	Ref string
	// Registry: credentials (the rest is the node's decision, as for
	// BuildImage: plain HTTP only to its InsecureRegistries, floored
	// addresses only for its PrivateRegistries; but never the operator's
	// credentials: a push writes with the caller's alone).
	Registry oci.Options
	// LayoutDir: write an OCI image layout into this directory of the
	// node instead: a path under the node's export directory
	// (<data-dir>/exports; relative to it, or absolute inside it), which
	// must not exist or be empty. Nothing outside it is ever written: a
	// caller of the node contract chooses no host path.
	LayoutDir string
	// BlobKey: store the OCI image layout as one tar (oci-layout,
	// index.json, blobs/sha256/...) in the node's blob store under this
	// key, for a caller that cannot read the node's disk.
	BlobKey string
}

// ExportResult describes an exported image.
type ExportResult struct {
	Ref    string // as pushed ("" for a layout)
	Digest string // manifest digest
	Layers int
	Bytes  int64 // compressed bytes of all layers
	// DiffBytes is the compressed size of the top layer: what the
	// sandbox changed.
	DiffBytes int64
	Changed   int // entries in the top layer
	Deleted   int // whiteouts in it
	// LayoutBytes is the size of the layout's tar (BlobKey only).
	LayoutBytes int64
}

// exportRevision changes when what an export writes for the same tree
// changes; it keys the cache of root filesystem layers.
const exportRevision = 1

// Export turns a running sandbox's filesystem into an OCI image of two
// layers: its root filesystem (the lower layer of its overlay, cached per
// root filesystem build) and what the sandbox changed over it (files
// added or changed, whiteouts for those deleted), read from inside the
// sandbox through its daemon, since gVisor keeps the sandbox's writes in
// its own memory. Config: the daemon's default user, working directory
// and environment (without what the create added: it may hold secrets).
//
// The sandbox keeps running: a file written during the export is in the
// image as it was when read. Errors: ErrNotFound for no such sandbox,
// ErrConflict when it is not running or a BlobKey is given to a node
// without a blob store, ErrInvalidArgument for a malformed
// request, reference, a plain-HTTP registry not in the insecure list, or
// refused credentials; ErrUnavailable for an unreachable registry.
func (n *Node) Export(ctx context.Context, spec ExportSpec) (ExportResult, error) {
	if err := ids.Validate("sandbox ID", spec.SandboxID); err != nil {
		return ExportResult{}, err
	}
	var ref name.Reference
	dests := 0
	for _, d := range []string{spec.Ref, spec.LayoutDir, spec.BlobKey} {
		if d != "" {
			dests++
		}
	}
	switch {
	case dests != 1:
		return ExportResult{}, errdefs.Invalidf("export %s: give one of a registry reference, a layout directory or a blob key", spec.SandboxID)
	case spec.BlobKey != "":
		if err := blob.CheckKey(spec.BlobKey); err != nil {
			return ExportResult{}, fmt.Errorf("export %s: %w", spec.SandboxID, err)
		}
		if n.blobs == nil {
			return ExportResult{}, errdefs.Conflictf("export %s: this node has no blob store to write the OCI layout to (start it with --blob-store)", spec.SandboxID)
		}
	case spec.Ref != "":
		var err error
		if ref, err = name.ParseReference(spec.Ref); err != nil {
			return ExportResult{}, errdefs.Invalidf("export %s: image reference %q: %v", spec.SandboxID, spec.Ref, err)
		}
		if spec.Registry, err = n.reg.options(ref, spec.Registry, n.Net.Floor, false); err != nil {
			return ExportResult{}, fmt.Errorf("export %s: %w", spec.SandboxID, err)
		}
	default:
		dir, err := n.exportPath(spec.LayoutDir)
		if err != nil {
			return ExportResult{}, fmt.Errorf("export %s: %w", spec.SandboxID, err)
		}
		spec.LayoutDir = dir
		if ents, err := os.ReadDir(spec.LayoutDir); err == nil && len(ents) > 0 {
			return ExportResult{}, errdefs.Invalidf("export %s: layout directory %s is not empty", spec.SandboxID, spec.LayoutDir)
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ExportResult{}, errdefs.Invalidf("export %s: layout directory %s: %v", spec.SandboxID, spec.LayoutDir, err)
		}
	}
	sb, err := n.Engine.Get(ctx, spec.SandboxID)
	if err != nil {
		return ExportResult{}, err
	}
	if sb.State != engine.StateRunning || !sb.Addr.IsValid() {
		return ExportResult{}, errdefs.Conflictf("export %s: sandbox is %s, not running", sb.ID, sb.State)
	}
	// The tree it runs over: its root filesystem's current build, or one
	// kept for it (an upgrade replaced the name's).
	lowerPath, stamp, err := rootfs.TreeOf(n.rootfsDir, sb.RootFSID)
	if err != nil {
		return ExportResult{}, err
	}
	start := time.Now()
	d := daemonOf(sb)

	// The defaults: a command started without options gets them.
	var defaults struct {
		User string   `json:"user"`
		Cwd  string   `json:"cwd"`
		Env  []string `json:"env"`
	}
	var out bytes.Buffer
	if err := d.run(ctx, false, []string{"-defaults"}, nil, &out); err != nil {
		return ExportResult{}, err
	}
	if err := json.Unmarshal(out.Bytes(), &defaults); err != nil {
		return ExportResult{}, fmt.Errorf("export %s: daemon defaults: %w", sb.ID, errors.Join(errdefs.ErrInternal, err))
	}

	// What the sandbox sees, against the lower layer.
	upper, err := d.manifest(ctx, 0)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export %s: %w", sb.ID, err)
	}
	lowerRoot, err := os.OpenRoot(lowerPath)
	if err != nil {
		return ExportResult{}, err
	}
	defer lowerRoot.Close()
	var lower []export.Entry
	if err := export.Walk(lowerPath, false, func(e export.Entry) error { lower = append(lower, e); return nil }); err != nil {
		return ExportResult{}, fmt.Errorf("export %s: root filesystem %s: %w", sb.ID, sb.RootFS, err)
	}
	changed, deleted := export.Diff(lower, upper)
	scanned := time.Since(start)

	base, err := n.rootfsLayer(ctx, sb.RootFS, stamp, lowerRoot)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export %s: root filesystem layer: %w", sb.ID, err)
	}
	diff, err := n.diffLayer(ctx, d, changed, deleted)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export %s: %w", sb.ID, err)
	}
	defer os.Remove(diff.Path)

	cfg := oci.ImageConfig{Env: n.exportEnv(sb, defaults.Env), User: defaults.User, WorkingDir: defaults.Cwd, Created: time.Now().UTC(),
		History: []string{"root filesystem " + sb.RootFS + " (" + stamp.ID + ")", "sandbox " + sb.ID}}
	if hasShell(upper) {
		// The start command of the sandbox is not known: a shell.
		cfg.Cmd = []string{"/bin/sh"}
	}
	img, err := oci.NewImage([]v1.Layer{base, diff}, cfg)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export %s: %w", sb.ID, errors.Join(errdefs.ErrInternal, err))
	}
	res := ExportResult{Layers: 2, Bytes: base.Size_ + diff.Size_, DiffBytes: diff.Size_, Changed: len(changed), Deleted: len(deleted)}
	var digest v1.Hash
	if ref != nil {
		digest, err = oci.Push(ctx, spec.Ref, img, spec.Registry)
		err = n.reg.explain(err, ref, spec.Registry, false)
		res.Ref = ref.String()
	} else if spec.LayoutDir != "" {
		digest, err = oci.WriteLayout(spec.LayoutDir, img, "")
	} else {
		digest, res.LayoutBytes, err = n.exportToBlob(ctx, spec.BlobKey, img)
	}
	if err != nil {
		return ExportResult{}, fmt.Errorf("export %s: %w", sb.ID, err)
	}
	res.Digest = digest.String()
	n.log.Info("sandbox exported", "sandbox_id", sb.ID, "ref", res.Ref, "layout", spec.LayoutDir, "blob", spec.BlobKey, "digest", res.Digest,
		"changed", res.Changed, "deleted", res.Deleted, "diff_bytes", res.DiffBytes, "scan", scanned, "took", time.Since(start))
	return res, nil
}

// exportToBlob writes img as an OCI layout in a scratch directory of the
// node (removed after) and stores it as one tar under key.
func (n *Node) exportToBlob(ctx context.Context, key string, img v1.Image) (v1.Hash, int64, error) {
	exports := filepath.Join(OCIStoreDir(n.rootfsDir), "exports")
	if err := os.MkdirAll(exports, 0o700); err != nil {
		return v1.Hash{}, 0, err
	}
	tmp, err := os.MkdirTemp(exports, ".layout-")
	if err != nil {
		return v1.Hash{}, 0, err
	}
	defer os.RemoveAll(tmp)
	digest, err := oci.WriteLayout(tmp, img, "")
	if err != nil {
		return v1.Hash{}, 0, err
	}
	size, err := PutLayoutTar(ctx, n.blobs, key, tmp)
	return digest, size, err
}

// perProcessEnv are the variables the daemon sets for each command
// itself; they are not the sandbox's environment.
var perProcessEnv = map[string]bool{"HOME": true, "USER": true, "LOGNAME": true, "SHELL": true, "PWD": true,
	"E2B_SANDBOX": true, "E2B_SANDBOX_ID": true, "TERM": true}

// exportEnv is the image's Env: the daemon's environment without the
// per-command variables and without what the sandbox's create added over
// the snapshot it was made from (credentials are often passed so).
func (n *Node) exportEnv(sb engine.Sandbox, env []string) []string {
	inherited := map[string]bool{}
	if m, err := n.Engine.Snapshots().Get(sb.Parent); err == nil {
		for _, kv := range m.Run.Env {
			inherited[kv] = true
		}
	}
	added := map[string]bool{}
	for _, kv := range sb.Run.Env {
		if !inherited[kv] {
			k, _, _ := strings.Cut(kv, "=")
			added[k] = true
		}
	}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !perProcessEnv[k] && !added[k] {
			out = append(out, kv)
		}
	}
	return out
}

// hasShell reports whether the sandbox has /bin/sh (the sandbox's view
// is the whole tree).
func hasShell(upper []export.Entry) bool {
	usrmerge := false
	for _, e := range upper {
		switch {
		case e.Path == "bin/sh":
			return true
		case e.Path == "bin" && e.Type == export.TypeSymlink:
			usrmerge = true
		case e.Path == "usr/bin/sh" && usrmerge:
			return true
		}
	}
	return false
}

// rootfsLayers serializes the making of each root filesystem layer in
// this process (others use what the first made).
var rootfsLayers sync.Map // cache dir -> *sync.Mutex

// rootfsLayer is the root filesystem name (build stamp) as one layer,
// without what export.Excluded names, made once per build and kept in
// <rootfs dir>/.oci/exports/<id>-<revision>/.
func (n *Node) rootfsLayer(ctx context.Context, name string, stamp rootfs.Stamp, root *os.Root) (*oci.FileLayer, error) {
	if err := ids.ValidateName("root filesystem ID", stamp.ID); err != nil {
		return nil, err
	}
	exports := filepath.Join(OCIStoreDir(n.rootfsDir), "exports")
	dir := filepath.Join(exports, stamp.ID+"-"+strconv.Itoa(exportRevision))
	mu, _ := rootfsLayers.LoadOrStore(dir, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	var l oci.FileLayer
	if err := atomicfs.ReadJSON(filepath.Join(dir, "layer.json"), &l); err == nil {
		l.Path = filepath.Join(dir, "layer.tar.gz")
		return &l, nil
	}
	if err := os.MkdirAll(exports, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(exports, ".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	b, err := oci.NewLayerBuilder(filepath.Join(tmp, "layer.tar.gz"))
	if err != nil {
		return nil, err
	}
	tw := &export.TarWriter{Root: root, TW: b.Tar}
	err = export.Walk(root.Name(), false, func(e export.Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, err := tw.Write(e.Path)
		return err
	})
	if err != nil {
		b.Abort()
		return nil, err
	}
	fl, err := b.Close()
	if err != nil {
		return nil, err
	}
	if err := atomicfs.WriteJSON(filepath.Join(tmp, "layer.json"), fl); err != nil {
		return nil, err
	}
	os.RemoveAll(dir) // a crashed maker's leftovers (no layer.json)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	fl.Path = filepath.Join(dir, "layer.tar.gz")
	n.log.Info("root filesystem layer made", "rootfs", name, "id", stamp.ID, "bytes", fl.Size_)
	return fl, nil
}

// diffLayer is the layer of what the sandbox changed: whiteouts for the
// deleted paths, then the changed entries as the daemon reads them now
// (spore-envd -tar). The sandbox's tar is checked: only the asked paths,
// each once, hard links only to paths before them.
func (n *Node) diffLayer(ctx context.Context, d *daemon, changed []export.Entry, deleted []string) (*oci.FileLayer, error) {
	tmpDir := filepath.Join(OCIStoreDir(n.rootfsDir), "exports")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return nil, err
	}
	b, err := oci.NewLayerBuilder(filepath.Join(tmpDir, ".diff-"+ids.New('x')+".tar.gz"))
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			b.Abort()
		}
	}()
	for _, p := range deleted {
		if err := b.Tar.WriteHeader(export.Whiteout(p)); err != nil {
			return nil, err
		}
	}
	want := make(map[string]bool, len(changed))
	paths := make([]string, len(changed))
	for i, e := range changed {
		want[e.Path] = true
		paths[i] = e.Path
	}
	if err := d.tar(ctx, paths, func(tr *tar.Reader) error { return copyChecked(tr, b.Tar, want) }); err != nil {
		return nil, err
	}
	fl, err := b.Close()
	if err != nil {
		return nil, err
	}
	ok = true
	return fl, nil
}

// copyChecked copies the sandbox's tar into the layer, refusing what was
// not asked for.
func copyChecked(tr *tar.Reader, tw *tar.Writer, want map[string]bool) error {
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: the sandbox's tar: %v", errdefs.ErrInternal, err)
		}
		p := strings.TrimSuffix(h.Name, "/")
		if !want[p] || seen[p] {
			return fmt.Errorf("%w: the sandbox's tar has %q, which was not asked for", errdefs.ErrInternal, h.Name)
		}
		seen[p] = true
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		case tar.TypeLink:
			if !seen[h.Linkname] || h.Linkname == p {
				return fmt.Errorf("%w: the sandbox's tar links %q to %q, not written before it", errdefs.ErrInternal, h.Name, h.Linkname)
			}
		default:
			return fmt.Errorf("%w: the sandbox's tar has %q of type %q", errdefs.ErrInternal, h.Name, h.Typeflag)
		}
		//lint:ignore SA1019 the reader fills Xattrs from PAX records: cleared so the sandbox adds none
		h.Uname, h.Gname, h.PAXRecords, h.Xattrs = "", "", nil, nil
		h.Format = tar.FormatUnknown
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return fmt.Errorf("%w: the sandbox's tar: %v", errdefs.ErrInternal, err)
			}
		}
	}
}

// daemon runs the export modes of the sandbox's daemon binary.
type daemon struct {
	pc    processpbconnect.ProcessClient
	token string
}

// daemonOf reaches running sandbox sb's daemon.
func daemonOf(sb engine.Sandbox) *daemon {
	return &daemon{pc: processpbconnect.NewProcessClient(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		envdclient.URL(sb.Addr, envd.Port)), token: sb.Run.AccessToken}
}

// tar has the daemon write the entries at paths (relative, parents
// first) as a tar (spore-envd -tar, as root), which read consumes as it
// streams; an error of either ends both.
func (d *daemon) tar(ctx context.Context, paths []string, read func(*tar.Reader) error) error {
	var list bytes.Buffer
	for _, p := range paths {
		list.WriteString(strconv.Quote(p))
		list.WriteByte('\n')
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := read(tar.NewReader(pr))
		pr.CloseWithError(err)
		done <- err
	}()
	err := d.run(ctx, true, []string{"-tar"}, list.Bytes(), pw)
	pw.CloseWithError(err)
	if rerr := <-done; err == nil && rerr != nil {
		err = rerr
	}
	return err
}

// errTooManyEntries ends a manifest read past its limit.
var errTooManyEntries = errors.New("too many entries")

// manifest reads the sandbox's filesystem as it sees it (spore-envd
// -manifest, as root): at most limit entries (0: no limit; more is
// ErrConflict).
func (d *daemon) manifest(ctx context.Context, limit int) ([]export.Entry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []export.Entry
	pr, pw := io.Pipe()
	parsed := make(chan error, 1)
	go func() {
		err := export.ReadManifest(pr, func(e export.Entry) error {
			if limit > 0 && len(out) == limit {
				cancel() // the daemon's command is ended with the stream
				return errTooManyEntries
			}
			out = append(out, e)
			return nil
		})
		pr.CloseWithError(err)
		parsed <- err
	}()
	err := d.run(ctx, true, []string{"-manifest"}, nil, pw)
	pw.CloseWithError(err)
	perr := <-parsed
	switch {
	case errors.Is(perr, errTooManyEntries):
		return nil, errdefs.Conflictf("the sandbox's filesystem has more than %d entries", limit)
	case err == nil && perr != nil:
		return nil, fmt.Errorf("%w: manifest: %v", errdefs.ErrInternal, perr)
	case err != nil:
		return nil, err
	}
	return out, nil
}

// run runs /opt/spore/bin/spore-envd with args (as root when root, else
// as the default user with the defaults), feeds it stdin, copies its
// stdout to out and fails with its stderr unless it exits 0.
func (d *daemon) run(ctx context.Context, root bool, args []string, stdin []byte, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	useStdin := stdin != nil
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: envdMountPoint + "/bin/spore-envd", Args: args}, Stdin: &useStdin})
	d.header(req.Header(), root)
	st, err := d.pc.Start(ctx, req)
	if err != nil {
		return fmt.Errorf("%w: daemon %v: %v", errdefs.ErrUnavailable, args, err)
	}
	defer st.Close()
	var stderr []byte
	code := int32(-1)
	fed := make(chan error, 1)
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if s := ev.GetStart(); s != nil && useStdin {
			go func(pid uint32) { fed <- d.feed(ctx, pid, stdin, root) }(s.GetPid())
		}
		if data := ev.GetData(); data != nil {
			if b := data.GetStdout(); len(b) > 0 {
				if _, err := out.Write(b); err != nil {
					return err
				}
			}
			if b := data.GetStderr(); len(b) > 0 && len(stderr) < 4096 {
				stderr = append(stderr, b...)
			}
		}
		if e := ev.GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	if err := st.Err(); err != nil {
		return fmt.Errorf("%w: daemon %v: %v", errdefs.ErrUnavailable, args, err)
	}
	if useStdin {
		if err := <-fed; err != nil {
			return fmt.Errorf("%w: daemon %v: input: %v", errdefs.ErrUnavailable, args, err)
		}
	}
	if code != 0 {
		return fmt.Errorf("%w: daemon %v exited %d: %s", errdefs.ErrInternal, args, code, bytes.TrimSpace(stderr))
	}
	return nil
}

func (d *daemon) header(h http.Header, root bool) {
	if d.token != "" {
		h.Set("X-Access-Token", d.token)
	}
	if root {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	}
}

// feed sends stdin to process pid in pieces, then closes its stdin.
func (d *daemon) feed(ctx context.Context, pid uint32, data []byte, root bool) error {
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	r := bufio.NewReader(bytes.NewReader(data))
	buf := make([]byte, 256<<10)
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			req := connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:k]...)}}})
			d.header(req.Header(), root)
			if _, err := d.pc.SendInput(ctx, req); err != nil {
				return err
			}
		}
		if err != nil {
			break
		}
	}
	req := connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})
	d.header(req.Header(), root)
	_, err := d.pc.CloseStdin(ctx, req)
	return err
}

// ExportDir is where exports may write OCI image layouts.
func (n *Node) ExportDir() string { return n.exportDir }

// exportPath is where a layout asked for at p goes: p relative to the
// export directory, or absolute inside it; clean, with no "..", and no
// symbolic link on the way out of it.
func (n *Node) exportPath(p string) (string, error) {
	if p == "" || filepath.Clean(p) != p || strings.Contains(p, "..") {
		return "", errdefs.Invalidf("layout directory %q is not a clean path under the node's export directory", p)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(n.exportDir, p)
	}
	rel, err := filepath.Rel(n.exportDir, p)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", errdefs.Invalidf("layout directory %s is outside the node's export directory %s", p, n.exportDir)
	}
	if err := os.MkdirAll(n.exportDir, 0o700); err != nil {
		return "", err
	}
	// Each existing component must be a real directory: a link could
	// lead the write anywhere.
	cur := n.exportDir
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		st, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", errdefs.Invalidf("layout directory %s: %v", p, err)
		}
		if !st.IsDir() {
			return "", errdefs.Invalidf("layout directory %s: %s is not a directory", p, cur)
		}
	}
	return p, nil
}
