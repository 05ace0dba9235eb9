package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/errdefs"
)

// newLogsCmd is `spore logs <sandbox>`: the sandbox's logs (lifecycle,
// the calls that changed it, its egress summary; GET /v2/sandboxes/{id}/
// logs), or with --egress its outbound connection attempts, allowed and
// denied, from every node it ran on; both kept after it is gone.
func newLogsCmd(f *cliFlags) *cobra.Command {
	var egress, follow bool
	var since, level string
	var limit int
	cmd := &cobra.Command{
		Use:   "logs <sandbox>",
		Short: "Show a sandbox's logs (its lifecycle and the calls that changed it), or with --egress its egress audit",
		Long: "Lists what Spore recorded of a sandbox's life, oldest first: its lifecycle events (created, paused,\n" +
			"resumed, hibernated, moved, rolled back, timed out, died, killed), the API calls that changed it (which key,\n" +
			"what answer) and its egress summary; kept after the sandbox is gone, for the audit retention. --follow\n" +
			"keeps printing new entries until the sandbox is gone (or Ctrl-C). The output of its processes is not kept.\n\n" +
			"With --egress, lists the sandbox's outbound connection attempts, oldest first: when, the protocol and\n" +
			"destination, the name asked for (TLS SNI or HTTP Host, under domain rules), allowed or denied and by which\n" +
			"rule, and the bytes each way of allowed connections (open ones so far). Kept after the sandbox is gone.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return fmt.Errorf("spore logs: --limit %d: want a positive number", limit)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			if egress {
				if follow || level != "" {
					return errors.New("spore logs: --follow and --level are for the sandbox's logs, not --egress")
				}
				return egressLogs(cmd, f, c, args[0], since, limit)
			}
			var from time.Time
			if since != "" {
				if from, err = sinceTime(since); err != nil {
					return err
				}
			}
			if limit > 1000 {
				return fmt.Errorf("spore logs: --limit %d: at most 1000", limit)
			}
			for {
				es, err := c.SandboxLogs(cmd.Context(), args[0], from, limit, level)
				if err != nil {
					return err
				}
				if f.json {
					for _, e := range es {
						if err := printJSONLine(cmd.OutOrStdout(), e); err != nil {
							return err
						}
					}
				} else {
					for _, e := range es {
						fmt.Fprintf(cmd.OutOrStdout(), "%s  %-5s  %-9s  %s\n", e.Timestamp, strings.ToUpper(e.Level), e.Fields["logger"], e.Message)
					}
				}
				if !follow {
					return nil
				}
				if len(es) > 0 {
					if t, err := time.Parse(time.RFC3339Nano, es[len(es)-1].Timestamp); err == nil {
						from = t.Add(time.Millisecond)
					}
				}
				if len(es) == 0 {
					if _, err := c.Get(cmd.Context(), args[0]); errdefs.IsNotFound(err) {
						return nil // gone, and every entry printed
					}
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&egress, "egress", false, "show the egress audit instead")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new entries until the sandbox is gone")
	cmd.Flags().StringVar(&level, "level", "", "only entries of this level and above (debug, info, warn, error)")
	cmd.Flags().StringVar(&since, "since", "", "only entries since this RFC 3339 time or this long ago (15m)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many (logs: the oldest, up to 1000; --egress: the newest, default the server's 10000)")
	return cmd
}

// sinceTime reads --since: an RFC 3339 time or a positive duration back
// from now.
func sinceTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("spore logs: --since %q: want an RFC 3339 time or a positive duration (15m)", v)
}

// egressLogs prints a sandbox's egress audit (spore logs --egress).
func egressLogs(cmd *cobra.Command, f *cliFlags, c *client.Client, id, since string, limit int) error {
	a, err := c.EgressAudit(cmd.Context(), id, since, limit)
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
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + ": " + b
}

// printJSONLine writes v as one line of JSON (a stream of entries).
func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
