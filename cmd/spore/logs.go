package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

// newLogsCmd is `spore logs --egress <sandbox>`: the sandbox's outbound
// connection attempts, allowed and denied, from every node it ran on
// (kept after it is gone, for the nodes' retention).
func newLogsCmd(f *cliFlags) *cobra.Command {
	var egress bool
	var since string
	var limit int
	cmd := &cobra.Command{
		Use:   "logs --egress <sandbox>",
		Short: "Show a sandbox's egress audit: every outbound connection attempt, allowed or denied",
		Long: "With --egress, lists the sandbox's outbound connection attempts, oldest first: when, the protocol and\n" +
			"destination, the name asked for (TLS SNI or HTTP Host, under domain rules), allowed or denied and by which\n" +
			"rule, and the bytes each way of allowed connections (open ones so far). Kept after the sandbox is gone.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !egress {
				return errors.New("spore logs: give --egress (the only logs served: the sandbox's outbound connections)")
			}
			if limit < 0 {
				return fmt.Errorf("spore logs: --limit %d: want a positive number", limit)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			a, err := c.EgressAudit(cmd.Context(), args[0], since, limit)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			rows := make([][]string, 0, len(a.Entries))
			for _, e := range a.Entries {
				verdict := "denied"
				if e.Allowed {
					verdict = "allowed"
				}
				if e.Open {
					verdict += " (open)"
				}
				dst := e.Dst
				if e.Domain != "" {
					dst = e.Domain + " (" + e.Dst + ")"
				}
				why := e.Rule
				if e.Reason != "" && e.Reason != "denied by rule" {
					why = join(why, e.Reason)
				}
				rows = append(rows, []string{e.At, e.Proto, dst, verdict, why, strconv.FormatInt(e.BytesOut, 10), strconv.FormatInt(e.BytesIn, 10)})
			}
			table(cmd.OutOrStdout(), "AT\tPROTO\tDESTINATION\tVERDICT\tRULE\tBYTES OUT\tBYTES IN", rows)
			if !a.Complete {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: a node could not be asked; its entries are missing")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&egress, "egress", false, "show the egress audit (required)")
	cmd.Flags().StringVar(&since, "since", "", "only attempts since this RFC 3339 time or this long ago (15m)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many, the newest (default: the server's maximum, 10000)")
	return cmd
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + ": " + b
}
