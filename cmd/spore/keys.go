package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/store"
)

func newKeyCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Manage API keys (a team admin key, or an operator key)",
		Long: `An API key acts in one team: a member key on everything its team owns
(sandboxes, snapshots, templates, secrets, volumes), an admin key on its team's
keys too. A scope narrows a key to operations and templates (a CI key that only
creates from ci-* templates). Operator keys belong to no team: the operator
routes (nodes, drain, blob GC, debug), teams, and every team's keys; on a
team's routes they act in the team --team names (default: the default team).
Only a key's hash is stored: a new key is printed once. A revoked key is refused
by every API replica within half a second and never comes back.`,
	}
	cmd.AddCommand(newKeyCreateCmd(f), newKeyListCmd(f), newKeyRevokeCmd(f))
	return cmd
}

func newKeyCreateCmd(f *cliFlags) *cobra.Command {
	var (
		req       api.CreateKeyRequest
		ops, tpls []string
		ttl       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Make an API key and print it (shown this once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			if len(ops) > 0 || len(tpls) > 0 {
				req.Scope = &store.KeyScope{Operations: ops, Templates: tpls}
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %v is negative", ttl)
			}
			req.TTLSeconds = int64(ttl / time.Second)
			if ttl > 0 && req.TTLSeconds == 0 {
				return fmt.Errorf("--ttl %v is under a second", ttl)
			}
			k, err := c.CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), k)
			}
			team := k.TeamID
			if team == "" {
				team = "no team"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s (%s, %s, %s): store it now, it is not shown again\n", k.ID, k.Role, team, k.Mask)
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "a label for the key")
	cmd.Flags().StringVar(&req.Role, "role", "", "member (default), admin (the team's keys too) or operator (no team; operators only)")
	cmd.Flags().StringVar(&req.TeamID, "key-team", "", "the key's team (an operator's choice; default: the team acted in)")
	cmd.Flags().StringSliceVar(&ops, "op", nil, "allow only these operations (repeat; "+strings.Join(api.Operations(), ", ")+")")
	cmd.Flags().StringSliceVar(&tpls, "template", nil, "with --op: allow creates only from templates matching these patterns (repeat; ci-*)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "the key expires after this long (720h); default never")
	return cmd
}

func newKeyListCmd(f *cliFlags) *cobra.Command {
	var all bool
	var team string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List API keys (never the keys themselves)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Keys(cmd.Context(), all, team)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, k := range list {
				revoked, used, expires, scope := "", "", "", ""
				if k.RevokedAt != "" {
					revoked = ago(k.RevokedAt)
				}
				if k.LastUsedAt != "" {
					used = ago(k.LastUsedAt)
				}
				if k.ExpiresAt != "" {
					expires = k.ExpiresAt
				}
				if k.Scope != nil {
					scope = strings.Join(k.Scope.Operations, ",")
					if len(k.Scope.Templates) > 0 {
						scope += " on " + strings.Join(k.Scope.Templates, ",")
					}
				}
				rows = append(rows, []string{k.ID, k.Name, k.TeamID, k.Role, scope, k.Mask, ago(k.CreatedAt), used, expires, revoked})
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tTEAM\tROLE\tSCOPE\tKEY\tCREATED\tUSED\tEXPIRES\tREVOKED", rows)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list revoked keys too")
	cmd.Flags().StringVar(&team, "of-team", "", "an operator's: only this team's keys")
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

func newTeamCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "team",
		Short: "Manage teams (create and rm need an operator key)",
		Long: `A team owns sandboxes, snapshots, templates, secrets and volumes; its keys see
nothing of another team's. Make a team, then its first admin key:
  spore team create research
  spore key create --key-team <team ID> --role admin --name lead`,
	}
	var createQuotas store.Quotas
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Make a team (with quotas: see team quota)",
		Long: `Makes a team. Without a quota flag it gets the deployment's default quotas
(spore up|api --default-team-quotas); with any, exactly those given (a
quota not given, or 0, is no limit: --sandboxes 0 makes a team with none).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			// No quota flag: the deployment's default quotas
			// (--default-team-quotas); any: exactly those given.
			var quotas *store.Quotas
			for _, name := range store.QuotaNames {
				if cmd.Flags().Changed(name) {
					quotas = &createQuotas
				}
			}
			t, err := c.CreateTeam(cmd.Context(), args[0], quotas)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.TeamID)
			return nil
		},
	}
	quotaFlags(create, &createQuotas)
	var setQuotas store.Quotas
	quota := &cobra.Command{
		Use:   "quota TEAM",
		Short: "Set a team's quotas (operators; a quota not given is no limit)",
		Long: `Replaces a team's quotas; a quota not given (or 0) is no limit. Over a quota,
a create is refused (403 naming it; 429 for the create rate) and nothing
changes. Lowering a quota under what the team holds keeps what it holds.
  spore team quota research --sandboxes 20 --vcpus 40 --memory-mb 40960 --creates-per-minute 120`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			t, err := c.SetTeamQuotas(cmd.Context(), args[0], setQuotas)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s quotas: %s\n", t.TeamID, quotaLine(t.Quotas))
			return nil
		},
	}
	quotaFlags(quota, &setQuotas)
	cmd.AddCommand(create, quota, &cobra.Command{
		Use:   "ls",
		Short: "List the teams the key sees (its own; an operator's, every team)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Teams(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, t := range list {
				acting := ""
				if t.IsDefault {
					acting = "*"
				}
				rows = append(rows, []string{t.TeamID, t.Name, acting})
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tACTING", rows)
			return nil
		},
	}, &cobra.Command{
		Use:   "info TEAM",
		Short: "Show a team (by ID or name)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			t, err := c.Team(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tCREATED", [][]string{{t.TeamID, t.Name, ago(t.CreatedAt)}})
			if u := t.Usage; u != nil {
				q := t.Quotas
				rows := [][]string{
					{"sandboxes", fmt.Sprint(u.Sandboxes), limit(int64(q.Sandboxes), fmt.Sprint)},
					{"vcpus", fmt.Sprint(u.VCPUs), limit(int64(q.VCPUs), fmt.Sprint)},
					{"memory", fmt.Sprintf("%d MiB", u.MemoryMB), limit(q.MemoryMB, func(a ...any) string { return fmt.Sprintf("%d MiB", a...) })},
					{"snapshots", fmt.Sprintf("%d (%s)", u.Snapshots, mib(u.SnapshotBytes)), limit(q.SnapshotBytes, func(a ...any) string { return mib(a[0].(int64)) })},
					{"volumes", fmt.Sprintf("%d (%s)", u.Volumes, mib(u.VolumeBytes)), limit(q.VolumeBytes, func(a ...any) string { return mib(a[0].(int64)) })},
					{"creates/minute", fmt.Sprint(u.CreatesLastMinute), limit(int64(q.CreatesPerMinute), fmt.Sprint)},
					{"hibernated", fmt.Sprint(u.Hibernated), "-"},
				}
				fmt.Fprintln(cmd.OutOrStdout())
				table(cmd.OutOrStdout(), "USAGE\tNOW\tQUOTA", rows)
			}
			return nil
		},
	}, &cobra.Command{
		Use:   "rm TEAM...",
		Short: "Remove empty teams (their keys are revoked)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			for _, t := range args {
				if err := c.DeleteTeam(cmd.Context(), t); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s removed\n", t)
			}
			return nil
		},
	})
	return cmd
}

// quotaFlags adds the quota flags to cmd, into q (named as
// store.QuotaNames).
func quotaFlags(cmd *cobra.Command, q *store.Quotas) {
	cmd.Flags().IntVar(&q.Sandboxes, "sandboxes", 0, "running sandboxes (creating, running or paused in memory)")
	cmd.Flags().IntVar(&q.VCPUs, "vcpus", 0, "their vCPUs in all")
	cmd.Flags().Int64Var(&q.MemoryMB, "memory-mb", 0, "their memory in all, MiB")
	cmd.Flags().Int64Var(&q.SnapshotBytes, "snapshot-bytes", 0, "the sizes of the team's snapshots in all")
	cmd.Flags().Int64Var(&q.VolumeBytes, "volume-bytes", 0, "the sizes of the team's volumes in all")
	cmd.Flags().IntVar(&q.CreatesPerMinute, "creates-per-minute", 0, "sandboxes created (creates, fork children) in any minute")
}

// limit shows a quota (0: none) with show.
func limit(n int64, show func(...any) string) string {
	if n == 0 {
		return "-"
	}
	return show(n)
}

// quotaLine is q in one line.
func quotaLine(q store.Quotas) string {
	if q.Zero() {
		return "none"
	}
	var parts []string
	for _, p := range []struct {
		name string
		n    int64
	}{{"sandboxes", int64(q.Sandboxes)}, {"vcpus", int64(q.VCPUs)}, {"memory-mb", q.MemoryMB}, {"snapshot-bytes", q.SnapshotBytes},
		{"volume-bytes", q.VolumeBytes}, {"creates-per-minute", int64(q.CreatesPerMinute)}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p.name, p.n))
		}
	}
	return strings.Join(parts, ", ")
}

// quotasFlag is a flag of quotas written as store.ParseQuotas reads them
// (--default-team-quotas).
type quotasFlag struct{ q *store.Quotas }

func (f quotasFlag) Type() string { return "quotas" }

func (f quotasFlag) Set(s string) error {
	q, err := store.ParseQuotas(s)
	if err != nil {
		return err
	}
	*f.q = q
	return nil
}

func (f quotasFlag) String() string {
	if f.q == nil || f.q.Zero() {
		return ""
	}
	var parts []string
	for i, n := range []int64{int64(f.q.Sandboxes), int64(f.q.VCPUs), f.q.MemoryMB, f.q.SnapshotBytes, f.q.VolumeBytes, int64(f.q.CreatesPerMinute)} {
		if n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", store.QuotaNames[i], n))
		}
	}
	return strings.Join(parts, ",")
}

// metricsTokenFlag adds --metrics-token-file (spore up, api), into path.
func metricsTokenFlag(f *pflag.FlagSet, path *string) {
	f.StringVar(path, "metrics-token-file", "", "file holding a token GET /metrics accepts as a bearer besides operator keys: Prometheus's credential, good for nothing else (at least 16 characters; docs/metrics.md)")
}

// defaultQuotasFlag adds --default-team-quotas, into q.
func defaultQuotasFlag(f *pflag.FlagSet, q *store.Quotas) {
	f.Var(quotasFlag{q}, "default-team-quotas", "the quotas of a team made without any (POST /teams, spore team create): NAME=N,... with names "+strings.Join(store.QuotaNames, ", ")+` (e.g. "sandboxes=20,vcpus=40,memory-mb=40960,creates-per-minute=120"; none: no limits)`)
}
