// Package dockerfile turns a Dockerfile into a template build spec
// (build.Spec), the way E2B's SDK does it client side (Template().
// fromDockerfile of e2b@2.51.0): one stage, RUN/COPY/ADD/ENV/ARG/WORKDIR/
// USER become steps, CMD/ENTRYPOINT the start command. It is parsed by
// BuildKit's own parser, and words are expanded and unquoted by BuildKit's
// shell lexer, so quoting and line continuations mean what Docker means.
package dockerfile

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/errdefs"
)

// DefaultReadyCmd is what the SDK sets when the Dockerfile has a CMD or
// ENTRYPOINT (waitForTimeout(20_000)).
const DefaultReadyCmd = "sleep 20"

// Options tune a conversion.
type Options struct {
	// ContextDir is the build context: COPY sources are read (hashed,
	// listed) from it, honouring its .dockerignore. Required when the
	// Dockerfile copies anything.
	ContextDir string
	// BuildArgs override ARG defaults (docker build --build-arg).
	BuildArgs map[string]string
	// ReadyCmd replaces DefaultReadyCmd.
	ReadyCmd string
}

// Context is what a client needs besides the spec.
type Context struct {
	// Copies has one entry per COPY step, in step order.
	Copies []Copy
	// Warnings name each instruction that was ignored, with its line.
	Warnings []string
}

// Copy is one COPY step's sources.
type Copy struct {
	Step      int    // index in Spec.Steps
	Line      int    // the Dockerfile line
	Src, Dest string // as in the step's args
	FilesHash string
	// Files are the paths (relative to the context, slash separated,
	// directories included) that TarFiles(ctxDir, Src) archives.
	Files []string
}

// Convert turns dockerfile into a build spec. Every error is
// errdefs.ErrInvalidArgument and names the Dockerfile line.
func Convert(ctx context.Context, dockerfile []byte, opts Options) (build.Spec, Context, error) {
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return build.Spec{}, Context{}, errdefs.Invalidf("dockerfile: %v", err)
	}
	c := &converter{
		ctx:  ctx,
		opts: opts,
		lex:  shell.NewLex(res.EscapeToken),
		env:  map[string]string{},
		meta: map[string]string{},
	}
	if err := c.run(res.AST); err != nil {
		return build.Spec{}, Context{}, err
	}
	return c.spec, c.out, nil
}

type converter struct {
	ctx  context.Context
	opts Options
	lex  *shell.Lex
	spec build.Spec
	out  Context
	// env is what ENV and ARG set so far (for expanding later words);
	// meta the ARGs before FROM (for expanding FROM only).
	env, meta map[string]string

	froms                   int
	userSet, workdirSet     bool
	entrypoint, cmd         []string
	entrypointJSON, cmdJSON bool
	entrypointSet, cmdSet   bool
}

func (c *converter) run(ast *parser.Node) error {
	// The SDK starts as root in / and, unless the Dockerfile says
	// otherwise, ends as E2B's "user" in /home/user.
	c.step(build.StepUser, "root")
	c.step(build.StepWorkdir, "/")
	for _, n := range ast.Children {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if err := c.instruction(n); err != nil {
			return err
		}
	}
	if c.froms == 0 {
		return errdefs.Invalidf("dockerfile: no FROM instruction")
	}
	if !c.userSet {
		c.step(build.StepUser, "user")
	}
	if !c.workdirSet {
		c.step(build.StepWorkdir, "/home/user")
	}
	c.startCmd()
	return nil
}

func (c *converter) step(kind string, args ...string) {
	c.spec.Steps = append(c.spec.Steps, build.Step{Type: kind, Args: args})
}

func (c *converter) warn(n *parser.Node, format string, args ...any) {
	c.out.Warnings = append(c.out.Warnings, fmt.Sprintf("line %d: %s: %s", n.StartLine, strings.ToUpper(n.Value), fmt.Sprintf(format, args...)))
}

func invalid(n *parser.Node, format string, args ...any) error {
	return errdefs.Invalidf("dockerfile line %d: %s: %s", n.StartLine, strings.ToUpper(n.Value), fmt.Sprintf(format, args...))
}

// lineErr puts n's line in err, keeping its kind first.
func lineErr(n *parser.Node, err error) error {
	if errdefs.IsInvalidArgument(err) {
		msg := strings.TrimPrefix(err.Error(), errdefs.ErrInvalidArgument.Error()+": ")
		return invalid(n, "%s", msg)
	}
	return fmt.Errorf("dockerfile line %d: %w", n.StartLine, err)
}

// words are the instruction's arguments as the parser split them.
func words(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

func (c *converter) instruction(n *parser.Node) error {
	kw := strings.ToLower(n.Value)
	if kw != "from" && kw != "arg" && c.froms == 0 {
		return invalid(n, "comes before FROM")
	}
	switch kw {
	case "from":
		return c.from(n)
	case "run":
		return c.run1(n)
	case "copy", "add":
		return c.copy(n, kw == "add")
	case "env":
		return c.envInstr(n)
	case "arg":
		return c.arg(n)
	case "workdir":
		v, err := c.single(n)
		if err != nil {
			return err
		}
		c.step(build.StepWorkdir, v)
		c.workdirSet = true
	case "user":
		v, err := c.single(n)
		if err != nil {
			return err
		}
		c.step(build.StepUser, v)
		c.userSet = true
	case "cmd", "entrypoint":
		return c.command(n, kw == "entrypoint")
	case "shell":
		// RUN lines are run by /bin/sh -c; another shell would change
		// what they mean, so this is refused rather than ignored.
		return invalid(n, "not supported (RUN lines run with /bin/sh -c)")
	default:
		// EXPOSE, VOLUME, LABEL, HEALTHCHECK, STOPSIGNAL, ONBUILD,
		// MAINTAINER: a sandbox has no use for them.
		c.warn(n, "ignored")
	}
	return nil
}

// expand unquotes and expands word with what ENV/ARG set so far.
// Variables the Dockerfile never set (the base image's, e.g. PATH) are
// kept as ${NAME}: their value is not known here.
func (c *converter) expand(n *parser.Node, word string, vars map[string]string) (string, error) {
	v, _, err := c.lex.ProcessWord(word, keepUnknown(vars))
	if err != nil {
		return "", invalid(n, "%v", err)
	}
	return v, nil
}

type keepUnknown map[string]string

func (k keepUnknown) Get(key string) (string, bool) {
	if v, ok := k[key]; ok {
		return v, true
	}
	return "${" + key + "}", true
}

func (k keepUnknown) Keys() []string {
	keys := make([]string, 0, len(k))
	for key := range k {
		keys = append(keys, key)
	}
	return keys
}

func (c *converter) single(n *parser.Node) (string, error) {
	w := words(n)
	if len(w) != 1 || len(n.Flags) > 0 {
		return "", invalid(n, "takes exactly one argument")
	}
	return c.expand(n, w[0], c.env)
}

func (c *converter) from(n *parser.Node) error {
	c.froms++
	if c.froms > 1 {
		return invalid(n, "multi-stage Dockerfiles are not supported (a second FROM)")
	}
	for _, f := range n.Flags {
		c.warn(n, "flag %s ignored", f)
	}
	w := words(n)
	if len(w) != 1 && !(len(w) == 3 && strings.EqualFold(w[1], "as")) {
		return invalid(n, "expected FROM <image> [AS <name>]")
	}
	image, err := c.expand(n, w[0], c.meta)
	if err != nil {
		return err
	}
	if image == "" || strings.Contains(image, "${") {
		return invalid(n, "image %q is not fully defined", w[0])
	}
	if image == "scratch" {
		return invalid(n, "FROM scratch is not supported: a sandbox needs a base image with a shell")
	}
	c.spec.FromImage = image
	return nil
}

func (c *converter) run1(n *parser.Node) error {
	for _, f := range n.Flags {
		if strings.HasPrefix(f, "--mount=") && strings.Contains(f, "type=cache") {
			c.warn(n, "flag %s ignored (no build cache mounts)", f)
			continue
		}
		return invalid(n, "flag %s not supported", f)
	}
	w := words(n)
	var cmd string
	switch {
	case n.Attributes["json"]:
		cmd = shellJoin(w)
	case len(n.Heredocs) > 0:
		var err error
		if cmd, err = heredocScript(n, strings.Join(w, " ")); err != nil {
			return err
		}
	default:
		cmd = strings.Join(w, " ")
	}
	if strings.TrimSpace(cmd) == "" {
		return invalid(n, "empty command")
	}
	c.step(build.StepRun, cmd)
	return nil
}

// heredocScript is the shell script for RUN with heredocs. A bare
// "RUN <<EOF" runs its body as the script (BuildKit does the same when
// the body has no #! line); otherwise the heredocs are fed to the
// command line by the shell itself, which understands them.
func heredocScript(n *parser.Node, line string) (string, error) {
	first := n.Heredocs[0]
	if h, _ := parser.ParseHeredoc(strings.TrimSpace(line)); h != nil && len(n.Heredocs) == 1 {
		if strings.HasPrefix(first.Content, "#!") {
			return "", invalid(n, "a heredoc with a #! interpreter line is not supported")
		}
		return first.Content, nil
	}
	var b strings.Builder
	b.WriteString(line)
	for _, h := range n.Heredocs {
		b.WriteString("\n")
		b.WriteString(h.Content)
		if !strings.HasSuffix(h.Content, "\n") {
			b.WriteString("\n")
		}
		b.WriteString(h.Name)
	}
	return b.String(), nil
}

func (c *converter) envInstr(n *parser.Node) error {
	// The parser gives (key, value, separator) triples.
	w := words(n)
	if len(w) == 0 || len(w)%3 != 0 {
		return invalid(n, "expected KEY=VALUE pairs")
	}
	args := make([]string, 0, len(w))
	for i := 0; i < len(w); i += 3 {
		k, err := c.expand(n, w[i], c.env)
		if err != nil {
			return err
		}
		v, err := c.expand(n, w[i+1], c.env)
		if err != nil {
			return err
		}
		c.env[k] = v
		args = append(args, k, v)
	}
	c.step(build.StepEnv, args...)
	return nil
}

// arg: like the SDK, an ARG becomes an ENV step (its default, or "");
// an ARG before FROM also serves FROM's expansion.
func (c *converter) arg(n *parser.Node) error {
	w := words(n)
	if len(w) == 0 {
		return invalid(n, "expected a name")
	}
	var args []string
	for _, kv := range w {
		k, v, hasDefault := strings.Cut(kv, "=")
		if k == "" {
			return invalid(n, "expected NAME[=default], got %q", kv)
		}
		vars := c.env
		if c.froms == 0 {
			vars = c.meta
		}
		if hasDefault {
			var err error
			if v, err = c.expand(n, v, vars); err != nil {
				return err
			}
		}
		if o, ok := c.opts.BuildArgs[k]; ok {
			v = o
		}
		vars[k] = v
		args = append(args, k, v)
	}
	c.step(build.StepEnv, args...)
	return nil
}

func (c *converter) command(n *parser.Node, entrypoint bool) error {
	w := words(n)
	json := n.Attributes["json"]
	if !json {
		w = []string{strings.Join(w, " ")}
	}
	if entrypoint {
		c.entrypoint, c.entrypointJSON, c.entrypointSet = w, json, true
	} else {
		c.cmd, c.cmdJSON, c.cmdSet = w, json, true
	}
	return nil
}

// startCmd combines ENTRYPOINT and CMD as Docker does: a shell-form
// ENTRYPOINT ignores CMD; an exec-form one gets CMD as its arguments
// (a shell-form CMD as /bin/sh -c <cmd>).
func (c *converter) startCmd() {
	var cmd string
	cmdArgs := c.cmd
	if c.cmdSet && !c.cmdJSON {
		cmdArgs = []string{"/bin/sh", "-c", c.cmd[0]}
	}
	switch {
	case c.entrypointSet && !c.entrypointJSON:
		cmd = c.entrypoint[0]
	case c.entrypointSet:
		cmd = shellJoin(append(append([]string{}, c.entrypoint...), cmdArgs...))
	case c.cmdSet && !c.cmdJSON:
		cmd = c.cmd[0]
	case c.cmdSet:
		cmd = shellJoin(c.cmd)
	}
	if strings.TrimSpace(cmd) == "" {
		return
	}
	c.spec.StartCmd = cmd
	c.spec.ReadyCmd = DefaultReadyCmd
	if c.opts.ReadyCmd != "" {
		c.spec.ReadyCmd = c.opts.ReadyCmd
	}
}

func (c *converter) copy(n *parser.Node, isAdd bool) error {
	if len(n.Heredocs) > 0 {
		return invalid(n, "heredocs are not supported; put the file in the build context")
	}
	var user, mode string
	for _, f := range n.Flags {
		name, val, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch name {
		case "chown":
			v, err := c.expand(n, val, c.env)
			if err != nil {
				return err
			}
			user = v
		case "chmod":
			v, err := c.expand(n, val, c.env)
			if err != nil {
				return err
			}
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o7777 {
				return invalid(n, "--chmod=%s is not an octal mode", val)
			}
			mode = fmt.Sprintf("%04o", m)
		case "link":
			// Only a layer-caching hint; the result is the same.
		case "from":
			return invalid(n, "--from is not supported (single-stage Dockerfiles only)")
		default:
			return invalid(n, "flag %s not supported", f)
		}
	}
	w := words(n)
	if len(w) < 2 {
		return invalid(n, "expected <src>... <dest>")
	}
	exp := make([]string, len(w))
	for i, s := range w {
		v, err := c.expand(n, s, c.env)
		if err != nil {
			return err
		}
		exp[i] = v
	}
	dest, srcs := exp[len(exp)-1], exp[:len(exp)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return invalid(n, "with several sources the destination must end with /")
	}
	for _, src := range srcs {
		if isAdd {
			if err := c.checkAdd(n, src); err != nil {
				return err
			}
		}
		if c.opts.ContextDir == "" {
			return invalid(n, "copies %q but no build context was given", src)
		}
		files, err := ListFiles(c.opts.ContextDir, src)
		if err != nil {
			return lineErr(n, err)
		}
		hash, err := HashFiles(c.opts.ContextDir, src, dest)
		if err != nil {
			return lineErr(n, err)
		}
		c.spec.Steps = append(c.spec.Steps, build.Step{
			Type: build.StepCopy, Args: []string{src, dest, user, mode}, FilesHash: hash,
		})
		c.out.Copies = append(c.out.Copies, Copy{
			Step: len(c.spec.Steps) - 1, Line: n.StartLine, Src: src, Dest: dest, FilesHash: hash, Files: files,
		})
	}
	return nil
}

// checkAdd refuses what ADD does beyond COPY: fetching URLs and
// unpacking local archives (the SDK would copy the archive as is, which
// is not what the Dockerfile means).
func (c *converter) checkAdd(n *parser.Node, src string) error {
	if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
		return invalid(n, "remote sources (%s) are not supported; download them in a RUN step", src)
	}
	if c.opts.ContextDir == "" || strings.ContainsAny(src, "*?[") {
		return nil
	}
	rel, err := cleanSrc(src)
	if err != nil {
		return lineErr(n, err)
	}
	f, err := os.Open(filepath.Join(c.opts.ContextDir, filepath.FromSlash(rel)))
	if err != nil {
		return nil // ListFiles reports it
	}
	defer f.Close()
	head := make([]byte, 512)
	k, _ := f.Read(head)
	if isArchive(head[:k]) {
		return invalid(n, "%s is an archive, which ADD would unpack: not supported; COPY it and unpack it in a RUN step", src)
	}
	return nil
}

func isArchive(b []byte) bool {
	for _, magic := range [][]byte{
		{0x1f, 0x8b},                  // gzip
		[]byte("BZh"),                 // bzip2
		{0xfd, '7', 'z', 'X', 'Z', 0}, // xz
		{0x28, 0xb5, 0x2f, 0xfd},      // zstd
	} {
		if bytes.HasPrefix(b, magic) {
			return true
		}
	}
	return len(b) >= 262 && bytes.Equal(b[257:262], []byte("ustar"))
}

// shellJoin quotes each word for /bin/sh and joins them.
func shellJoin(w []string) string {
	q := make([]string, len(w))
	for i, s := range w {
		q[i] = shellQuote(s)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%_+=:,./-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// cleanSrc is src relative to the context, slash separated; absolute
// and escaping paths are refused.
func cleanSrc(src string) (string, error) {
	if src == "" {
		return "", errdefs.Invalidf("empty source path")
	}
	if path.IsAbs(src) || filepath.IsAbs(src) {
		return "", errdefs.Invalidf("source path %q is absolute: it must be relative to the build context", src)
	}
	c := path.Clean(filepath.ToSlash(src))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errdefs.Invalidf("source path %q escapes the build context", src)
	}
	return c, nil
}
