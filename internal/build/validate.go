package build

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// Limits on a spec, so that one request cannot make a build that never
// ends or a row that fills the store.
const (
	MaxSteps    = 500
	maxArg      = 64 << 10 // one argument (a RUN script)
	maxSpecSize = 1 << 20  // the whole spec, JSON
)

var (
	hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}\$?$|^[0-9]{1,10}$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	modeRE = regexp.MustCompile(`^[0-7]{3,4}$`)
)

// ValidHash reports whether h is a files hash as the SDK computes it
// (SHA-256, lower-case hex).
func ValidHash(h string) bool { return hashRE.MatchString(h) }

// Validate checks a spec before anything runs: every error is
// errdefs.ErrInvalidArgument and names the step (1-based, as the SDK
// counts them: its step 0 is the base).
func (s Spec) Validate() error {
	switch {
	case s.FromImage == "" && s.FromTemplate == "":
		return errdefs.Invalidf("the build names no base: give fromImage or fromTemplate")
	case s.FromImage != "" && s.FromTemplate != "":
		return errdefs.Invalidf("the build names two bases (fromImage %q and fromTemplate %q): give one", s.FromImage, s.FromTemplate)
	case len(s.Steps) > MaxSteps:
		return errdefs.Invalidf("the build has %d steps; at most %d", len(s.Steps), MaxSteps)
	case len(s.StartCmd) > maxArg || len(s.ReadyCmd) > maxArg:
		return errdefs.Invalidf("startCmd or readyCmd is over %d bytes", maxArg)
	}
	if s.FromImage != "" && (len(s.FromImage) > 512 || strings.ContainsAny(s.FromImage, " \t\n")) {
		return errdefs.Invalidf("fromImage %q is not an image reference", s.FromImage)
	}
	if r := s.FromImageRegistry; r != nil {
		switch r.Type {
		case "registry":
			if (r.Username == "") != (r.Password == "") {
				return errdefs.Invalidf("fromImageRegistry: give both username and password, or neither")
			}
		case "gcp":
			if err := validServiceAccount(r.ServiceAccountJSON); err != nil {
				return err
			}
		case "aws":
			return errdefs.Invalidf("fromImageRegistry type \"aws\" is not supported by Spore: use type \"registry\" (fromImage with credentials) with user name AWS and the output of `aws ecr get-login-password` as the password")
		default:
			return errdefs.Invalidf("fromImageRegistry type %q is unknown", r.Type)
		}
		if s.FromImage == "" {
			return errdefs.Invalidf("fromImageRegistry is given without fromImage")
		}
	}
	for i, st := range s.Steps {
		if err := st.validate(); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, st.Type, err)
		}
	}
	return nil
}

// validServiceAccount checks a GCP service account key: a JSON object
// naming its account (client_email) and holding a private key.
func validServiceAccount(s string) error {
	var key struct {
		ClientEmail string `json:"client_email"`
		PrivateKey  string `json:"private_key"`
	}
	if err := json.Unmarshal([]byte(s), &key); err != nil {
		return errdefs.Invalidf("fromImageRegistry type \"gcp\": serviceAccountJson is not a JSON service account key: %v", err)
	}
	if key.ClientEmail == "" || key.PrivateKey == "" {
		return errdefs.Invalidf("fromImageRegistry type \"gcp\": serviceAccountJson has no client_email or private_key: want a service account's JSON key")
	}
	return nil
}

func (st Step) validate() error {
	for _, a := range st.Args {
		if len(a) > maxArg {
			return errdefs.Invalidf("an argument is over %d bytes", maxArg)
		}
		if strings.ContainsRune(a, 0) {
			return errdefs.Invalidf("an argument holds a NUL byte")
		}
	}
	want := func(lo, hi int) error {
		if len(st.Args) < lo || len(st.Args) > hi {
			return errdefs.Invalidf("want %d to %d arguments, got %d", lo, hi, len(st.Args))
		}
		return nil
	}
	switch st.Type {
	case StepRun:
		if err := want(1, 2); err != nil {
			return err
		}
		if strings.TrimSpace(st.Args[0]) == "" {
			return errdefs.Invalidf("an empty command")
		}
		if len(st.Args) == 2 && st.Args[1] != "" && !userRE.MatchString(st.Args[1]) {
			return errdefs.Invalidf("user %q is malformed", st.Args[1])
		}
	case StepCopy:
		if err := want(2, 4); err != nil {
			return err
		}
		if !ValidHash(st.FilesHash) {
			return errdefs.Invalidf("filesHash %q is not a SHA-256 in hex", st.FilesHash)
		}
		if err := relPath(st.Args[0]); err != nil {
			return err
		}
		if st.Args[1] == "" {
			return errdefs.Invalidf("no destination")
		}
		if len(st.Args) > 2 && st.Args[2] != "" && !userRE.MatchString(strings.SplitN(st.Args[2], ":", 2)[0]) {
			return errdefs.Invalidf("user %q is malformed", st.Args[2])
		}
		if len(st.Args) > 3 && st.Args[3] != "" && !modeRE.MatchString(st.Args[3]) {
			return errdefs.Invalidf("mode %q is not octal", st.Args[3])
		}
	case StepEnv:
		if len(st.Args) == 0 || len(st.Args)%2 != 0 {
			return errdefs.Invalidf("want key, value pairs, got %d arguments", len(st.Args))
		}
		for i := 0; i < len(st.Args); i += 2 {
			if !envRE.MatchString(st.Args[i]) {
				return errdefs.Invalidf("%q is not an environment variable name", st.Args[i])
			}
		}
	case StepWorkdir:
		if err := want(1, 1); err != nil {
			return err
		}
		if st.Args[0] == "" {
			return errdefs.Invalidf("an empty directory")
		}
	case StepUser:
		if err := want(1, 1); err != nil {
			return err
		}
		if !userRE.MatchString(st.Args[0]) {
			return errdefs.Invalidf("user %q is malformed", st.Args[0])
		}
	default:
		return errdefs.Invalidf("unknown step type %q (want RUN, COPY, ENV, WORKDIR or USER)", st.Type)
	}
	return nil
}

// relPath refuses a copy source that leaves the build context.
func relPath(p string) error {
	if p == "" || path.IsAbs(p) {
		return errdefs.Invalidf("copy source %q must be a path inside the build context", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return errdefs.Invalidf("copy source %q leaves the build context", p)
		}
	}
	return nil
}

// StepName is how the SDK names step i (0-based) of a spec in a build's
// status: its stack traces count the base as 0.
func StepName(i int) string { return strconv.Itoa(i + 1) }

// Step names for what is not a step.
const (
	StepBase     = "base"
	StepFinalize = "finalize"
)
