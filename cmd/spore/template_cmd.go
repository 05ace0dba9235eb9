package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
)

func newTemplateCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Build, list, tag and remove templates"}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, t := range list {
				rows = append(rows, []string{t.TemplateID, strings.Join(t.Aliases, ","), strconv.Itoa(t.CPUCount), strconv.Itoa(t.MemoryMB), strconv.Itoa(t.DiskSizeMB), ago(t.CreatedAt)})
			}
			table(cmd.OutOrStdout(), "TEMPLATE\tNAMES\tCPU\tMEM MB\tDISK MB\tBUILT", rows)
			return nil
		},
	}
	rm := simple(f, "rm <template>...", "Remove templates", func(cmd *cobra.Command, id string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		return c.DeleteTemplate(cmd.Context(), id)
	})
	cmd.AddCommand(ls, newTemplateBuildCmd(f), newTemplateLogsCmd(f), newTemplateShowCmd(f),
		newTemplateTagsCmd(f), newTemplateTagCmd(f), newTemplateUntagCmd(f), rm)
	return cmd
}

func newTemplateBuildCmd(f *cliFlags) *cobra.Command {
	o := &buildOpts{}
	cmd := &cobra.Command{
		Use:   "build <name[:tag]>",
		Short: "Build a template on the server: from a Dockerfile, an OCI image or a template, with steps",
		Long: `Build a template with the server's template builder (E2B's template build API).

What to build from, one of:
  --dockerfile FILE     a Dockerfile (single stage; COPY files are uploaded
                        from --context, default the Dockerfile's directory)
  --from-image REF      an OCI image (--registry-user/--registry-password-file
                        for a registry that needs them)
  --from-template NAME  a template (name or name:tag) or snapshot; the
                        default is base
Then, without --dockerfile, the steps in this order: --env, --workdir, each
--run (in order, as root), --user (the sandboxes' default user). --start
starts a command that keeps running; --ready (or --ready-port, --ready-url)
is run until it exits 0; then the sandbox, processes and memory included, is
snapshotted as the template. Each step is cached by its inputs: a rebuild
reruns only from the first changed step (--skip-cache reruns all).

Logs stream to stderr; on success the template's snapshot ID goes to stdout
(the build ID with --no-wait). A failed build names its step and exits 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			return runBuild(cmd.Context(), c, args[0], o, f.json, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.dockerfile, "dockerfile", "", "build from this Dockerfile")
	fl.StringVar(&o.contextDir, "context", "", "the Dockerfile's build context (default: its directory)")
	fl.StringArrayVar(&o.buildArgs, "build-arg", nil, "a Dockerfile ARG value, KEY=VALUE (repeatable)")
	fl.StringVar(&o.fromImage, "from-image", "", "build from this OCI image reference")
	fl.StringVar(&o.registryUser, "registry-user", "", "user name for --from-image's registry")
	fl.StringVar(&o.registryPasswordFile, "registry-password-file", "", "file holding the password for --from-image's registry")
	fl.StringVar(&o.fromTemplate, "from-template", "", "build from this template (name[:tag]) or snapshot (default base)")
	fl.StringVar(&o.fromTemplate, "from", "", "same as --from-template")
	fl.StringArrayVar(&o.run, "run", nil, "a shell command run as root (repeatable, run in order)")
	fl.StringArrayVar(&o.env, "env", nil, "an environment variable KEY=VALUE of the template (repeatable)")
	fl.StringVar(&o.workdir, "workdir", "", "the template's working directory (created if missing)")
	fl.StringVar(&o.user, "user", "", "the template's default user")
	fl.StringVar(&o.start, "start", "", "a command started at the end of the build that keeps running in the template")
	fl.StringVar(&o.ready, "ready", "", "a shell command run until it exits 0 before the snapshot")
	fl.IntVar(&o.readyPort, "ready-port", 0, "ready once something listens on this port (E2B's waitForPort: needs ss in the image)")
	fl.StringVar(&o.readyURL, "ready-url", "", "ready once this URL answers 200 (E2B's waitForURL: needs curl in the image)")
	fl.StringArrayVar(&o.tags, "tag", nil, "a tag for the build (repeatable; with none, and no name:tag, the build gets the tag default)")
	fl.BoolVar(&o.skipCache, "skip-cache", false, "rerun every step, ignoring the build cache")
	fl.IntVar(&o.cpu, "cpu", 0, "vCPUs of the template's sandboxes (0: the default)")
	fl.IntVar(&o.memory, "memory-mb", 0, "memory of the template's sandboxes in MiB (0: the default)")
	fl.BoolVar(&o.noWait, "no-wait", false, "print the build ID once started and return (follow it with template logs --follow)")
	var readyTimeout string
	fl.StringVar(&readyTimeout, "ready-timeout", "", "")
	fl.MarkDeprecated("ready-timeout", "the server bounds the ready command's wait (5 minutes)")
	return cmd
}

func newTemplateLogsCmd(f *cliFlags) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs <name> <buildID>",
		Short: "Print a template build's logs (--follow: until it ends, exit 1 if it failed)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx, tpl, id := cmd.Context(), args[0], args[1]
			if follow && !f.json {
				info, err := followBuild(ctx, c, tpl, id, 0, cmd.OutOrStdout())
				if err != nil {
					return err
				}
				if info.Status != "ready" {
					return buildFailed(tpl, info)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "template %s built (build %s)\n", tpl, id)
				return nil
			}
			var all api.BuildInfo
			if follow {
				// --json --follow: the whole log once the build ended.
				if all, err = followBuild(ctx, c, tpl, id, 0, discard{}); err != nil {
					return err
				}
			}
			// Every entry so far, page by page.
			var entries []api.BuildLogEntry
			for {
				info, err := c.BuildStatus(ctx, tpl, id, len(entries))
				if err != nil {
					return err
				}
				entries = append(entries, info.LogEntries...)
				if !follow {
					all = info
				}
				if len(info.LogEntries) == 0 {
					break
				}
			}
			all.LogEntries = entries
			if f.json {
				return printJSON(cmd.OutOrStdout(), all)
			}
			for _, e := range entries {
				printLogEntry(cmd.OutOrStdout(), e)
			}
			if all.Status == "error" {
				fmt.Fprintln(cmd.ErrOrStderr(), buildFailed(tpl, all))
			} else if all.Status != "ready" {
				fmt.Fprintf(cmd.ErrOrStderr(), "build %s is %s\n", id, all.Status)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print entries as they come until the build ends")
	return cmd
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func newTemplateShowCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show <name>",
		Short: "Show a template and its builds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			t, err := c.Template(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "template %s (names %s), created %s, updated %s\n", t.TemplateID, strings.Join(t.Names, ","), ago(t.CreatedAt), ago(t.UpdatedAt))
			var rows [][]string
			for _, b := range t.Builds {
				finished := "-"
				if b.FinishedAt != "" {
					finished = ago(b.FinishedAt)
				}
				rows = append(rows, []string{b.BuildID, b.Status, strconv.Itoa(b.CPUCount), strconv.Itoa(b.MemoryMB), ago(b.CreatedAt), finished})
			}
			table(w, "BUILD\tSTATUS\tCPU\tMEM MB\tCREATED\tFINISHED", rows)
			return nil
		},
	}
}

func newTemplateTagsCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "tags <name>",
		Short: "List a template's tags",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			tags, err := c.TemplateTags(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), tags)
			}
			var rows [][]string
			for _, t := range tags {
				rows = append(rows, []string{t.Tag, t.BuildID, ago(t.CreatedAt)})
			}
			table(cmd.OutOrStdout(), "TAG\tBUILD\tCREATED", rows)
			return nil
		},
	}
}

func newTemplateTagCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "tag <name[:tag]> <newtag>...",
		Short: "Give more tags to the build name:tag names (name alone: name:default)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			id, err := c.AssignTags(cmd.Context(), args[0], args[1:])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"buildID": id, "tags": args[1:]})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "build %s tagged %s\n", id, strings.Join(args[1:], ", "))
			return nil
		},
	}
}

func newTemplateUntagCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "untag <name> <tag>...",
		Short: "Remove tags of a template (all must exist; none is removed otherwise)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.Contains(args[0], ":") {
				return errors.New("untag <name> <tag>...: name without a tag")
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			return c.RemoveTags(cmd.Context(), args[0], args[1:])
		},
	}
}
