package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/server"
)

// cliFlags are the client verbs' shared flags.
type cliFlags struct {
	g    *globalFlags
	json bool
}

// client returns an API client from SPORE_API_URL and SPORE_API_KEY (or
// the key a local `spore up` generated).
func (f *cliFlags) client() (*client.Client, error) {
	base := os.Getenv("SPORE_API_URL")
	if base == "" {
		base = "http://127.0.0.1:3000"
	}
	key := os.Getenv("SPORE_API_KEY")
	if key == "" {
		if b, err := os.ReadFile(server.KeyFile(f.g.dataDir)); err == nil {
			key = strings.TrimSpace(string(b))
		}
	}
	if key == "" {
		return nil, errors.New("no API key: set SPORE_API_KEY (spore up prints it)")
	}
	return client.New(base, key).WithTeam(f.g.team), nil
}

// exitError carries a command's exit code out of cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints rows under a header, aligned.
func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

func ago(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	d := time.Until(t).Round(time.Second)
	if d < 0 {
		return (-d).String() + " ago"
	}
	return "in " + d.String()
}

// parseKV parses k=v flags.
func parseKV(kind string, list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want key=value", kind, kv)
		}
		out[k] = v
	}
	return out, nil
}

// splitRemote parses "sandboxID:/path" (a remote side of cp).
func splitRemote(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/.") || filepath.IsAbs(s) {
		return "", "", false
	}
	return id, path, true
}

func newClientCmds(g *globalFlags) []*cobra.Command {
	f := &cliFlags{g: g}
	cmds := []*cobra.Command{
		newStartCmd(f), newLsCmd(f), newInfoCmd(f), newExecCmd(f), newConnectCmd(f), newCpCmd(f),
		newPauseCmd(f), newResumeCmd(f), newKillCmd(f), newTimeoutCmd(f), newSnapshotCmd(f), newForkCmd(f),
		newRollbackCmd(f), newTemplateCmd(f), newBenchCmd(f), newNodesCmd(f), newGCCmd(f), newLogsCmd(f), newSecretCmd(f), newVolumeCmd(f), newKeyCmd(f), newTeamCmd(f), newAuditCmd(f),
	}
	for _, c := range cmds {
		c.PersistentFlags().BoolVar(&f.json, "json", false, "print JSON")
	}
	return cmds
}
