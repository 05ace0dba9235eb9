package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/spore-run/spore/internal/client"
	processpb "github.com/spore-run/spore/proto/gen/process"
)

func userAuth(req connect.AnyRequest, user string) {
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

func newExecCmd(f *cliFlags) *cobra.Command {
	var user, cwd string
	var env []string
	var stdin bool
	cmd := &cobra.Command{
		Use:   "exec <sandbox> -- <command> [args...]",
		Short: "Run a command in a sandbox, stream its output, exit with its exit code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sb, err := c.Open(ctx, args[0])
			if err != nil {
				return err
			}
			envm, err := parseKV("env", env)
			if err != nil {
				return err
			}
			pc := &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", shellJoin(args[1:])}, Envs: envm}
			if cwd != "" {
				pc.Cwd = &cwd
			}
			req := connect.NewRequest(&processpb.StartRequest{Process: pc, Stdin: &stdin})
			userAuth(req, user)
			st, err := sb.Proc.Start(ctx, req)
			if err != nil {
				return err
			}
			code := -1
			for st.Receive() {
				ev := st.Msg().GetEvent()
				switch {
				case ev.GetStart() != nil && stdin:
					go forwardStdin(ctx, sb, ev.GetStart().GetPid(), user)
				case ev.GetData() != nil:
					cmd.OutOrStdout().Write(ev.GetData().GetStdout())
					cmd.ErrOrStderr().Write(ev.GetData().GetStderr())
				case ev.GetEnd() != nil:
					code = int(ev.GetEnd().GetExitCode())
					if e := ev.GetEnd().GetError(); e != "" {
						fmt.Fprintln(cmd.ErrOrStderr(), "spore:", e)
					}
				}
			}
			if err := st.Err(); err != nil {
				return err
			}
			if code != 0 {
				return exitError{code: max(code, 1)}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "run as this user (default: the sandbox's, \"user\")")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory")
	cmd.Flags().StringArrayVar(&env, "env", nil, "KEY=VALUE (repeatable)")
	cmd.Flags().BoolVarP(&stdin, "interactive", "i", false, "forward standard input")
	return cmd
}

// shellJoin quotes args for bash -c.
func shellJoin(args []string) string {
	if len(args) == 1 {
		return args[0] // one argument: a shell command line as given
	}
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func forwardStdin(ctx context.Context, sb *client.Sandbox, pid uint32, user string) {
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	buf := make([]byte, 32*1024)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			req := connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}})
			userAuth(req, user)
			if _, err := sb.Proc.SendInput(ctx, req); err != nil {
				return
			}
		}
		if err != nil {
			req := connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})
			sb.Proc.CloseStdin(ctx, req)
			return
		}
	}
}

func newConnectCmd(f *cliFlags) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "connect <sandbox>",
		Short: "Open an interactive shell in a sandbox (resumes it when paused or hibernated)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sb, err := c.Open(ctx, args[0])
			if err != nil {
				return err
			}
			cols, rows := 80, 24
			fd := int(os.Stdin.Fd())
			isTTY := term.IsTerminal(fd)
			if isTTY {
				if w, h, err := term.GetSize(fd); err == nil {
					cols, rows = w, h
				}
			}
			req := connect.NewRequest(&processpb.StartRequest{
				Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": envOr("TERM", "xterm-256color")}},
				Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}},
			})
			userAuth(req, user)
			st, err := sb.Proc.Start(ctx, req)
			if err != nil {
				return err
			}
			if !st.Receive() {
				return fmt.Errorf("shell did not start: %v", st.Err())
			}
			pid := st.Msg().GetEvent().GetStart().GetPid()
			sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
			if isTTY {
				old, err := term.MakeRaw(fd)
				if err != nil {
					return err
				}
				defer term.Restore(fd, old)
				winch := make(chan os.Signal, 1)
				signal.Notify(winch, syscall.SIGWINCH)
				defer signal.Stop(winch)
				go func() {
					for range winch {
						if w, h, err := term.GetSize(fd); err == nil {
							sb.Proc.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: uint32(w), Rows: uint32(h)}}}))
						}
					}
				}()
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := os.Stdin.Read(buf)
					if n > 0 {
						sb.Proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: append([]byte(nil), buf[:n]...)}}}))
					}
					if err != nil {
						sb.Proc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte{4}}}}))
						return
					}
				}
			}()
			code := 0
			for st.Receive() {
				ev := st.Msg().GetEvent()
				if d := ev.GetData(); d != nil {
					cmd.OutOrStdout().Write(d.GetPty())
				}
				if e := ev.GetEnd(); e != nil {
					code = int(e.GetExitCode())
				}
			}
			if code != 0 {
				return exitError{code: max(code, 1)}
			}
			return st.Err()
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "log in as this user")
	return cmd
}

func newCpCmd(f *cliFlags) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp <src> <dst>",
		Short: "Copy a file to or from a sandbox: spore cp ./f <id>:/path, spore cp <id>:/path ./f (- for stdin/stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if id, path, ok := splitRemote(args[1]); ok {
				if _, _, remote := splitRemote(args[0]); remote {
					return fmt.Errorf("copy between two sandboxes: download first")
				}
				var r io.Reader = os.Stdin
				if args[0] != "-" {
					fh, err := os.Open(args[0])
					if err != nil {
						return err
					}
					defer fh.Close()
					r = fh
				}
				sb, err := c.Open(ctx, id)
				if err != nil {
					return err
				}
				return sb.Upload(ctx, path, r, user)
			}
			if id, path, ok := splitRemote(args[0]); ok {
				sb, err := c.Open(ctx, id)
				if err != nil {
					return err
				}
				if args[1] == "-" {
					return sb.Download(ctx, path, cmd.OutOrStdout(), user)
				}
				tmp := args[1] + ".spore-part"
				fh, err := os.Create(tmp)
				if err != nil {
					return err
				}
				if err := sb.Download(ctx, path, fh, user); err != nil {
					fh.Close()
					os.Remove(tmp)
					return err
				}
				if err := fh.Close(); err != nil {
					return err
				}
				return os.Rename(tmp, args[1])
			}
			return fmt.Errorf("one side must be <sandbox>:<path>")
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "file owner / reader in the sandbox")
	return cmd
}
