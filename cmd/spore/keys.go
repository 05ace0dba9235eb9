package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newKeyCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Manage API keys (an admin key is needed)",
		Long: `API keys are user keys (every sandbox, snapshot, template and secret route) or
admin keys (those, and the operator routes: nodes, drain, blob GC, debug, keys).
Only a key's hash is stored: a new key is printed once. A revoked key is refused
by every API replica within half a second and never comes back.`,
	}
	cmd.AddCommand(newKeyCreateCmd(f), newKeyListCmd(f), newKeyRevokeCmd(f))
	return cmd
}

func newKeyCreateCmd(f *cliFlags) *cobra.Command {
	var name string
	var admin bool
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Make an API key and print it (shown this once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			role := "user"
			if admin {
				role = "admin"
			}
			k, err := c.CreateKey(cmd.Context(), name, role)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s (%s, %s): store it now, it is not shown again\n", k.ID, k.Role, k.Mask)
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a label for the key")
	cmd.Flags().BoolVar(&admin, "admin", false, "an admin key (operator routes too)")
	return cmd
}

func newKeyListCmd(f *cliFlags) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List API keys (never the keys themselves)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Keys(cmd.Context(), all)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, k := range list {
				revoked := ""
				if k.RevokedAt != "" {
					revoked = ago(k.RevokedAt)
				}
				rows = append(rows, []string{k.ID, k.Name, k.Role, k.Source, k.Mask, ago(k.CreatedAt), revoked})
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tROLE\tSOURCE\tKEY\tCREATED\tREVOKED", rows)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list revoked keys too")
	return cmd
}

func newKeyRevokeCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke API keys (refused everywhere within half a second)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.RevokeKey(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s revoked\n", id)
			}
			return nil
		},
	}
}
