package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
)

// newExportCmd is `spore snapshot export`.
func newExportCmd(f *cliFlags) *cobra.Command {
	var sandbox bool
	var user, passFile string
	cmd := &cobra.Command{
		Use:   "export <snapshot|template|sandbox> <registry/repo:tag>",
		Short: "Push a snapshot's, template's or running sandbox's filesystem as an OCI image",
		Long: `Export a filesystem as an OCI image and push it to a registry: the root
filesystem plus the changes made in the sandbox (a snapshot or template is
started in a sandbox for the export). Any Spore can build a template from
the image (spore template build --from-image), and container tools can run
it: docker run -it <ref> (it holds no Spore daemon and no running process).
--sandbox exports a running sandbox instead.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
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
	return cmd
}
