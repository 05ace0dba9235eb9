package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
)

// newExportCmd is `spore snapshot export`.
func newExportCmd(f *cliFlags) *cobra.Command {
	var sandbox bool
	var user, passFile, layoutDir string
	cmd := &cobra.Command{
		Use:   "export <snapshot|template|sandbox> (<registry/repo:tag> | --oci-layout DIR)",
		Short: "Push a snapshot's, template's or running sandbox's filesystem as an OCI image, or write it as an OCI layout",
		Long: `Export a filesystem as an OCI image and push it to a registry: the root
filesystem plus the changes made in the sandbox (a snapshot or template is
started in a sandbox for the export). Any Spore can build a template from
the image (spore template build --from-image), and container tools can run
it: docker run -it <ref> (it holds no Spore daemon and no running process).
--oci-layout DIR writes the image as an OCI image layout into DIR (empty or
missing) instead of pushing it (skopeo copy oci:DIR ..., crane, podman load).
--sandbox exports a running sandbox instead.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if layoutDir != "" {
				if len(args) != 1 {
					return fmt.Errorf("with --oci-layout give only the snapshot, template or sandbox (no registry reference)")
				}
				return nil
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if layoutDir != "" {
				if user != "" || passFile != "" {
					return fmt.Errorf("--registry-user and --registry-password-file are for pushing, not --oci-layout")
				}
				return exportLayout(cmd, f, args[0], sandbox, layoutDir)
			}
			req := api.ExportRequest{Ref: args[1], Username: user}
			if passFile != "" {
				b, err := os.ReadFile(passFile)
				if err != nil {
					return fmt.Errorf("--registry-password-file: %w", err)
				}
				req.Password = strings.TrimSpace(string(b))
			}
			if (req.Username == "") != (req.Password == "") {
				return fmt.Errorf("give --registry-user and --registry-password-file together, or neither")
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := c.Export(cmd.Context(), args[0], sandbox, req)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s@%s (%d layers, %d bytes; changes: %d entries, %d deleted, %d bytes)\n",
				out.Ref, out.Digest, out.Layers, out.Bytes, out.Changed, out.Deleted, out.DiffBytes)
			return nil
		},
	}
	cmd.Flags().BoolVar(&sandbox, "sandbox", false, "the first argument is a running sandbox")
	cmd.Flags().StringVar(&user, "registry-user", "", "registry user name")
	cmd.Flags().StringVar(&passFile, "registry-password-file", "", "file holding the registry password")
	cmd.Flags().StringVar(&layoutDir, "oci-layout", "", "write the image as an OCI image layout into this directory (empty or missing) instead of pushing it")
	return cmd
}

// exportLayout streams the export's layout tar into dir. A failure
// leaves dir as it found it (missing, or empty).
func exportLayout(cmd *cobra.Command, f *cliFlags, id string, sandbox bool, dir string) (err error) {
	created, err := prepareLayoutDir(dir)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			emptyDir(dir, created)
		}
	}()
	c, err := f.client()
	if err != nil {
		return err
	}
	body, size, digest, err := c.ExportLayout(cmd.Context(), id, sandbox)
	if err != nil {
		return err
	}
	defer body.Close()
	n, err := extractLayout(body, dir)
	if err != nil {
		return fmt.Errorf("OCI layout into %s: %w", dir, err)
	}
	if size >= 0 && n != size {
		return fmt.Errorf("OCI layout into %s: got %d bytes of %d", dir, n, size)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return fmt.Errorf("OCI layout into %s: no index.json in what the server sent", dir)
	}
	if f.json {
		return printJSON(cmd.OutOrStdout(), map[string]any{"layout": dir, "digest": digest, "bytes": n})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: OCI image layout of %s (%d bytes)\n", dir, digest, n)
	return nil
}

// prepareLayoutDir makes dir (created reports so) or checks it is an
// empty directory.
func prepareLayoutDir(dir string) (created bool, err error) {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(dir, 0o755); err != nil {
			return false, fmt.Errorf("--oci-layout: %w", err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("--oci-layout: %w", err)
	case len(ents) > 0:
		return false, fmt.Errorf("--oci-layout: %s is not empty", dir)
	}
	return false, nil
}

// emptyDir undoes a failed extraction: dir was empty (or missing).
func emptyDir(dir string, created bool) {
	if created {
		os.RemoveAll(dir)
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// extractLayout unpacks the layout tar r into dir and returns the tar's
// length. The server is not trusted with the client's disk: names must be
// local (relative, no ".." element), entries regular files and
// directories only, and every write goes through an os.Root of dir, so
// nothing lands outside it whatever the tar holds.
func extractLayout(r io.Reader, dir string) (int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			// The rest of the stream: the tar's padding.
			_, err := io.Copy(io.Discard, cr)
			return cr.n, err
		}
		if err != nil {
			return cr.n, err
		}
		name := strings.TrimSuffix(h.Name, "/")
		if strings.Contains(h.Name, `\`) || !filepath.IsLocal(name) || filepath.Clean(name) != name {
			return cr.n, fmt.Errorf("the tar has %q, which is not a relative path inside the layout", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return cr.n, err
			}
		case tar.TypeReg:
			if d := filepath.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o755); err != nil {
					return cr.n, err
				}
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return cr.n, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return cr.n, err
			}
		default:
			return cr.n, fmt.Errorf("the tar has %q of type %q: a layout holds only files and directories", h.Name, h.Typeflag)
		}
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}
