package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/client"
)

func newAuditCmd(f *cliFlags) *cobra.Command {
	var q client.AuditQuery
	var since, until string
	var jsonl bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the team's audit trail: API calls that changed something, sandbox events, egress summaries",
		Long: `Lists the audit trail of the team the key acts in, newest first: who (key),
what (the route or event, and the resource), the outcome (HTTP status), when,
from where. Records outlive the sandboxes they name. A team admin or operator
key reads it; --all (an operator's) reads every team's.
  spore audit --resource <sandbox ID> --since 24h
  spore audit --since 2026-12-01T00:00:00Z --jsonl > audit.jsonl   (an export: every record)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if q.Since, err = timeOrAgo("since", since); err != nil {
				return err
			}
			if q.Until, err = timeOrAgo("until", until); err != nil {
				return err
			}
			if q.Limit < 0 {
				return fmt.Errorf("spore audit: --limit %d: want a positive number", q.Limit)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			if jsonl {
				return c.ExportAudit(cmd.Context(), q, cmd.OutOrStdout())
			}
			recs, next, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), recs)
			}
			rows := make([][]string, 0, len(recs))
			for _, r := range recs {
				status := ""
				if r.Status != 0 {
					status = strconv.Itoa(r.Status)
				}
				who := r.KeyName
				if who == "" {
					who = r.KeyID
				}
				if q.All {
					who = strings.TrimPrefix(r.TeamID+"/"+who, "/")
				}
				rows = append(rows, []string{r.At.Format(time.RFC3339), r.Action, r.Resource, status, who, r.Remote, r.Detail})
			}
			table(cmd.OutOrStdout(), "AT\tACTION\tRESOURCE\tSTATUS\tKEY\tFROM\tDETAIL", rows)
			if next != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --next %s\n", next)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&q.Resource, "resource", "", "only records of this resource (a sandbox, snapshot, template, secret, volume, key or team ID)")
	fl.StringVar(&since, "since", "", "only records at or after this RFC 3339 time, or this long ago (24h)")
	fl.StringVar(&until, "until", "", "only records before this RFC 3339 time, or this long ago")
	fl.IntVar(&q.Limit, "limit", 100, "records per page (at most 1000)")
	fl.StringVar(&q.Next, "next", "", "the page after the one that printed this token")
	fl.BoolVar(&q.All, "all", false, "every team's records (operator keys)")
	fl.BoolVar(&jsonl, "jsonl", false, "write every record selected as JSON lines (an export; ignores --limit)")
	return cmd
}

// timeOrAgo reads an RFC 3339 time or a duration ago ("": zero).
func timeOrAgo(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, errors.New("spore audit: --" + name + " " + strconv.Quote(v) + ": want an RFC 3339 time or a positive duration (24h)")
}
