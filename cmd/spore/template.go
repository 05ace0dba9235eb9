package main

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/spore-run/spore/internal/api"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

// buildTemplate builds a template through the API: a sandbox from `from`,
// `run` executed in it, `ready` polled until it passes, a template
// snapshot under name, the sandbox killed. It returns the template's ID.
func buildTemplate(ctx context.Context, f *cliFlags, name, from, run, ready string, readyTimeout time.Duration) (string, error) {
	c, err := f.client()
	if err != nil {
		return "", err
	}
	secs := int64(readyTimeout/time.Second) + 600
	sbr, err := c.Create(ctx, api.CreateRequest{TemplateID: from, Timeout: &secs, Metadata: map[string]string{"spore.template-build": name}})
	if err != nil {
		return "", err
	}
	defer c.Kill(context.WithoutCancel(ctx), sbr.SandboxID)
	sb, err := c.Open(ctx, sbr.SandboxID)
	if err != nil {
		return "", err
	}
	sh := func(script string) (int, string, error) {
		req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}})
		userAuth(req, "root")
		st, err := sb.Proc.Start(ctx, req)
		if err != nil {
			return -1, "", err
		}
		out, code := "", -1
		for st.Receive() {
			ev := st.Msg().GetEvent()
			if d := ev.GetData(); d != nil {
				out += string(d.GetStdout()) + string(d.GetStderr())
			}
			if e := ev.GetEnd(); e != nil {
				code = int(e.GetExitCode())
			}
		}
		return code, out, st.Err()
	}
	if run != "" {
		code, out, err := sh(run)
		if err != nil {
			return "", err
		}
		if code != 0 {
			return "", fmt.Errorf("--run exited %d: %s", code, out)
		}
	}
	if ready != "" {
		deadline := time.Now().Add(readyTimeout)
		for {
			code, out, err := sh(ready)
			if err != nil {
				return "", err
			}
			if code == 0 {
				break
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("--ready did not pass within %v (last exit %d: %s)", readyTimeout, code, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	sn, err := c.Snapshot(ctx, sbr.SandboxID, name, true)
	if err != nil {
		return "", err
	}
	return sn.SnapshotID, nil
}
