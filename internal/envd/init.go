package envd

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// InitRequest is the body of POST /init. The node sends it after every
// create, restore and fork, so each sandbox gets its own identity and
// access token even when many are restored from one image.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	AccessToken    *string           `json:"accessToken,omitempty"` // nil keeps the token; "" removes it
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	SandboxID      string            `json:"sandboxID,omitempty"`
	// EgressCA (Spore's) is the sandbox's egress CA, PEM: added to its
	// trust store, and the environment that points clients at it set.
	EgressCA string `json:"sporeEgressCA,omitempty"`
	// VolumeMounts (Spore's) are the volumes to show at their paths
	// (docs/volumes.md).
	VolumeMounts []VolumeMount `json:"sporeVolumeMounts,omitempty"`
}

const maxInitBody = 1 << 20

func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req InitRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxInitBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && err != io.EOF {
		jsonError(w, http.StatusBadRequest, "malformed /init body: "+err.Error())
		return
	}
	if req.DefaultUser != "" {
		if _, err := s.defaults.Lookup(req.DefaultUser); err != nil {
			jsonError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			jsonError(w, http.StatusBadRequest, "invalid environment variable name "+k)
			return
		}
	}
	if req.EgressCA != "" {
		if err := installCA([]byte(req.EgressCA)); err != nil {
			jsonError(w, http.StatusBadRequest, err.Error())
			return
		}
		have := s.defaults.Env()
		if req.EnvVars == nil {
			req.EnvVars = map[string]string{}
		}
		for k, v := range trustEnv() {
			if _, set := have[k]; !set {
				if _, asked := req.EnvVars[k]; !asked {
					req.EnvVars[k] = v
				}
			}
		}
	}
	if len(req.VolumeMounts) > 0 {
		if err := mountVolumes(req.VolumeMounts); err != nil {
			jsonError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	token := ""
	if req.AccessToken != nil {
		token = *req.AccessToken
	}
	s.defaults.Update(req.EnvVars, req.DefaultUser, req.DefaultWorkdir, token, req.SandboxID, req.AccessToken != nil)
	s.log.Info("init", "sandbox_id", req.SandboxID, "env_vars", len(req.EnvVars), "token_set", req.AccessToken != nil)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) envs(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.defaults.Env())
}
