package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/client"
)

func newSecretCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets: values injected into sandboxes' outbound requests, never shown to them",
		Long: `Secrets are E2B's: write-only values kept sealed in the store (AES-256-GCM under
the API's secrets key). A value is read from standard input (or --value-file),
never from the command line, where other users of the host could see it; one
trailing newline is dropped.`,
	}
	cmd.AddCommand(newSecretSetCmd(f, true), newSecretSetCmd(f, false), newSecretListCmd(f), newSecretGetCmd(f), newSecretRmCmd(f))
	return cmd
}

// readValue reads a secret's value from file ("" or "-": stdin).
func readValue(cmd *cobra.Command, file string) (string, error) {
	var r io.Reader = cmd.InOrStdin()
	if file != "" && file != "-" {
		fh, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return "", err
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", fmt.Errorf("no value: give it on standard input or with --value-file")
	}
	return v, nil
}

func newSecretSetCmd(f *cliFlags, create bool) *cobra.Command {
	var file string
	var md []string
	use, short := "create NAME", "Create a secret (value on stdin)"
	if !create {
		use, short = "update NAME|ID", "Store a new value (the next version) of a secret (value on stdin)"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := parseKV("metadata", md)
			if err != nil {
				return err
			}
			value, err := readValue(cmd, file)
			if err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			var s api.Secret
			if create {
				s, err = c.CreateSecret(cmd.Context(), args[0], value, meta)
			} else {
				s, err = c.UpdateSecret(cmd.Context(), args[0], value, meta)
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s version %d\n", s.SecretID, s.Name, s.CurrentVersion)
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "value-file", "", "read the value from this file (- or none: standard input)")
	cmd.Flags().StringSliceVar(&md, "metadata", nil, "metadata k=v,... (update: replaces it)")
	return cmd
}

func newSecretListCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List secrets (never their values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, s := range list {
				rows = append(rows, []string{s.SecretID, s.Name, fmt.Sprint(s.CurrentVersion), ago(s.UpdatedAt), kvString(s.Metadata)})
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tVERSION\tUPDATED\tMETADATA", rows)
			return nil
		},
	}
}

func kvString(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func newSecretGetCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME|ID",
		Short: "Show a secret's metadata (never its value)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			s, err := c.Secret(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tVERSION\tCREATED\tUPDATED\tMETADATA",
				[][]string{{s.SecretID, s.Name, fmt.Sprint(s.CurrentVersion), ago(s.CreatedAt), ago(s.UpdatedAt), kvString(s.Metadata)}})
			return nil
		},
	}
}

func newSecretRmCmd(f *cliFlags) *cobra.Command {
	return newRmCmd(f, "rm NAME|ID...", "Delete secrets", (*client.Client).DeleteSecret)
}

// newRmCmd is a verb that deletes each ref given with del, saying so.
func newRmCmd(f *cliFlags, use, short string, del func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			for _, ref := range args {
				if err := del(c, cmd.Context(), ref); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", ref)
			}
			return nil
		},
	}
}
