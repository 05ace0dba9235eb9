package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
)

func newStartCmd(f *cliFlags) *cobra.Command {
	var timeout time.Duration
	var md, env, vols []string
	var noInternet, autoPause bool
	cmd := &cobra.Command{
		Use:     "start <template|snapshot>",
		Aliases: []string{"create"},
		Short:   "Start a sandbox from a template or a snapshot",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			mdm, err := parseKV("metadata", md)
			if err != nil {
				return err
			}
			envm, err := parseKV("env", env)
			if err != nil {
				return err
			}
			mounts, err := parseVolumeFlags(vols)
			if err != nil {
				return err
			}
			secs := int64(timeout / time.Second)
			req := api.CreateRequest{TemplateID: args[0], Timeout: &secs, Metadata: mdm, EnvVars: envm, AutoPause: autoPause, VolumeMounts: mounts}
			if noInternet {
				no := false
				req.AllowInternetAccess = &no
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "kill (or hibernate, with --auto-pause) after this long")
	cmd.Flags().StringArrayVar(&md, "metadata", nil, "key=value metadata (repeatable)")
	cmd.Flags().StringArrayVar(&env, "env", nil, "KEY=VALUE environment for commands (repeatable)")
	cmd.Flags().BoolVar(&noInternet, "no-internet", false, "no outbound internet access")
	cmd.Flags().BoolVar(&autoPause, "auto-pause", false, "hibernate instead of kill on timeout")
	cmd.Flags().StringArrayVar(&vols, "volume", nil, "NAME:/path[:ro] mounts a volume (repeatable; see spore volume)")
	return cmd
}

// parseVolumeFlags reads --volume NAME:/path[:ro] flags.
func parseVolumeFlags(flags []string) ([]api.VolumeMount, error) {
	var out []api.VolumeMount
	for _, f := range flags {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") || len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw" {
			return nil, fmt.Errorf("--volume %q: want NAME:/path or NAME:/path:ro", f)
		}
		out = append(out, api.VolumeMount{Name: parts[0], Path: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"})
	}
	return out, nil
}

func newLsCmd(f *cliFlags) *cobra.Command {
	var md []string
	var states []string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			mdm, err := parseKV("metadata", md)
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), mdm, states)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, s := range list {
				rows = append(rows, []string{s.SandboxID, s.TemplateID, s.SporeState, strconv.Itoa(s.CPUCount), strconv.Itoa(s.MemoryMB), ago(s.StartedAt), ago(s.EndAt), fmt.Sprint(s.Metadata)})
			}
			table(cmd.OutOrStdout(), "SANDBOX\tTEMPLATE\tSTATE\tCPU\tMEM MB\tSTARTED\tENDS\tMETADATA", rows)
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&md, "metadata", nil, "only sandboxes with key=value (repeatable)")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only these states: running, paused")
	return cmd
}

func newInfoCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "info <sandbox>",
		Short: "Show a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			s, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			rows := [][]string{
				{"sandbox", s.SandboxID}, {"template", s.TemplateID}, {"state", s.SporeState},
				{"cpus", strconv.Itoa(s.CPUCount)}, {"memory MB", strconv.Itoa(s.MemoryMB)}, {"disk MB", strconv.Itoa(s.DiskSizeMB)},
				{"started", s.StartedAt}, {"ends", s.EndAt + " (" + ago(s.EndAt) + ")"}, {"on timeout", s.Lifecycle.OnTimeout},
				{"internet", strconv.FormatBool(s.AllowInternetAccess)}, {"metadata", fmt.Sprint(s.Metadata)},
			}
			for _, v := range s.VolumeMounts {
				mode := "rw"
				if v.ReadOnly {
					mode = "ro"
				}
				rows = append(rows, []string{"volume", v.Name + ":" + v.Path + ":" + mode})
			}
			table(cmd.OutOrStdout(), "FIELD\tVALUE", rows)
			return nil
		},
	}
}

// simple builds a verb that calls fn on each sandbox ID given.
func simple(f *cliFlags, use, short string, fn func(cmd *cobra.Command, id string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := fn(cmd, id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
			}
			return nil
		},
	}
}

func newPauseCmd(f *cliFlags) *cobra.Command {
	var hibernate bool
	cmd := simple(f, "pause <sandbox>...", "Pause sandboxes in memory (--hibernate: to disk, freeing memory)", nil)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		for _, id := range args {
			if hibernate {
				err = c.Hibernate(cmd.Context(), id)
			} else {
				err = c.Pause(cmd.Context(), id)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", id, err)
			}
		}
		return nil
	}
	cmd.Flags().BoolVar(&hibernate, "hibernate", false, "checkpoint to disk and free memory")
	return cmd
}

func newResumeCmd(f *cliFlags) *cobra.Command {
	return simple(f, "resume <sandbox>...", "Resume paused or hibernated sandboxes", func(cmd *cobra.Command, id string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		_, err = c.Connect(cmd.Context(), id, 0)
		return err
	})
}

func newKillCmd(f *cliFlags) *cobra.Command {
	return simple(f, "kill <sandbox>...", "Kill sandboxes (their snapshots stay)", func(cmd *cobra.Command, id string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		return c.Kill(cmd.Context(), id)
	})
}

func newTimeoutCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout <sandbox> <duration>",
		Short: "Set a sandbox's timeout from now (e.g. 10m)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				if n, nerr := strconv.Atoi(args[1]); nerr == nil {
					d, err = time.Duration(n)*time.Second, nil
				}
			}
			if err != nil || d <= 0 {
				return fmt.Errorf("timeout %q: want a positive duration such as 90s or 10m", args[1])
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			return c.SetTimeout(cmd.Context(), args[0], d)
		},
	}
}
