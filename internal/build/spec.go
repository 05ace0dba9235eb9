// Package build runs template builds: a base (an OCI image, a template or
// a snapshot), then steps (copy, run, env, workdir, user), then a start
// command and its ready check, then a snapshot, memory included, that
// becomes the template. Each step's result is cached by the hash of its
// inputs and its parent's, so a rebuild reruns only from the first
// changed step.
//
// The spec is E2B's (TemplateBuildStartV2 of the stock SDK e2b@2.51.0):
// the SDK's Template builder and Spore's Dockerfile conversion both
// produce it.
package build

import "encoding/json"

// Spec is what to build. Exactly one of FromImage and FromTemplate is set.
type Spec struct {
	FromImage         string    `json:"fromImage,omitempty"`
	FromImageRegistry *Registry `json:"fromImageRegistry,omitempty"`
	// FromTemplate is a template name (optionally name:tag) or a
	// snapshot's ID or name.
	FromTemplate string `json:"fromTemplate,omitempty"`
	Steps        []Step `json:"steps"`
	// StartCmd is started (a shell command) once the steps ran and keeps
	// running: it is in the template's snapshot.
	StartCmd string `json:"startCmd,omitempty"`
	// ReadyCmd is run (a shell command) until it exits 0; then the
	// template is snapshotted.
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Force reruns every step regardless of the cache.
	Force bool `json:"force,omitempty"`
}

// Registry is how to reach FromImage's registry, as the stock SDK sends
// it: Type "registry" (fromImage's username and password) or "gcp"
// (fromGCPRegistry's service account key, sent to the registry as
// Google's "_json_key" basic credentials); "aws" (fromAWSRegistry) is
// refused: its keys would have to be exchanged with AWS for a registry
// token, which Spore does not do. These are the only credentials a pull
// uses, beside those of the node's operator (see node.BuildImage).
type Registry struct {
	Type     string `json:"type"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// ServiceAccountJSON: Type "gcp", a service account's JSON key.
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
	// AWS fields, read only to refuse them clearly.
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
}

// gcpUser is the user name Google's registries (Artifact Registry,
// Container Registry) take with a service account's JSON key as the
// password.
const gcpUser = "_json_key"

// Credentials returns the basic credentials the registry is given
// ("", "" for none). The spec must be valid.
func (r *Registry) Credentials() (user, password string) {
	switch {
	case r == nil:
		return "", ""
	case r.Type == "gcp":
		return gcpUser, r.ServiceAccountJSON
	}
	return r.Username, r.Password
}

// identity names whose credentials these are, for the image base's cache
// name: the user name, or the service account's e-mail address (every
// service account has the same user name).
func (r *Registry) identity() string {
	if r == nil {
		return ""
	}
	if r.Type == "gcp" {
		var key struct {
			ClientEmail string `json:"client_email"`
		}
		_ = json.Unmarshal([]byte(r.ServiceAccountJSON), &key) // checked by Validate
		return "gcp:" + key.ClientEmail
	}
	return r.Username
}

// Step kinds and their Args, as E2B sends them.
const (
	// StepRun: [command] or [command, user]; the command is run by a
	// shell, as user (default: the current USER), in the current WORKDIR.
	StepRun = "RUN"
	// StepCopy: [src, dest, user, mode]; src is a path relative to the
	// build context, whose files were uploaded as a tar (optionally
	// gzipped) under FilesHash; user ("" = root) owns what is written,
	// mode ("" = as archived, else octal) applies to files written.
	StepCopy = "COPY"
	// StepEnv: [key1, value1, key2, value2, ...].
	StepEnv = "ENV"
	// StepWorkdir: [dir]; created if missing.
	StepWorkdir = "WORKDIR"
	// StepUser: [user]; must exist.
	StepUser = "USER"
)

// Step is one build step.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	// Force reruns this step (and so every later one) regardless of the
	// cache.
	Force bool `json:"force,omitempty"`
}
