package node

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/spore-run/spore/internal/errdefs"
)

// maxRegistryAuthFile bounds the operator's credentials file: it is read
// at every pull.
const maxRegistryAuthFile = 1 << 20

// RegistryAuth is the operator's registry credentials
// (Config.RegistryAuthFile): per registry, as a reference names it
// ("registry.example.com", "host:5000", "index.docker.io"), what the node
// sends when a pull brings no credentials of its own. It implements
// authn.Keychain: a registry it does not list is pulled anonymously.
type RegistryAuth map[string]authn.AuthConfig

// Resolve implements authn.Keychain.
func (a RegistryAuth) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if c, ok := a[r.RegistryStr()]; ok {
		return authn.FromConfig(c), nil
	}
	return authn.Anonymous, nil
}

// LoadRegistryAuth reads the operator's registry credentials: Docker's
// config.json form limited to its "auths" (each entry "auth" (base64 of
// user:password), or "username" and "password", or an "identitytoken" or
// "registrytoken"), so a file written by `docker --config DIR login` on
// another machine serves as is. Credential helpers ("credsStore",
// "credHelpers") are refused: the node runs no programs to find
// credentials. The file must be a regular file that only its owner may
// read or write (mode 0600 or stricter): it holds secrets. Errors are
// errdefs.ErrInvalidArgument naming what is wrong.
func LoadRegistryAuth(path string) (RegistryAuth, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, errdefs.Invalidf("registry auth file: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errdefs.Invalidf("registry auth file: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.Invalidf("registry auth file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, errdefs.Invalidf("registry auth file %s has mode %#o: it holds credentials, make it 0600 (chmod 600 %s)", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return nil, errdefs.Invalidf("registry auth file %s belongs to uid %d: it must be this process's (uid %d) or root's", path, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRegistryAuthFile+1))
	if err != nil {
		return nil, errdefs.Invalidf("registry auth file: %v", err)
	}
	if len(b) > maxRegistryAuthFile {
		return nil, errdefs.Invalidf("registry auth file %s is over %d bytes", path, maxRegistryAuthFile)
	}
	return parseRegistryAuth(path, b)
}

func parseRegistryAuth(path string, b []byte) (RegistryAuth, error) {
	var file struct {
		Auths       map[string]authn.AuthConfig `json:"auths"`
		CredsStore  string                      `json:"credsStore"`
		CredHelpers map[string]string           `json:"credHelpers"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return nil, errdefs.Invalidf("registry auth file %s: %v (want Docker's config.json form: {\"auths\": {\"registry.example.com\": {\"username\": ..., \"password\": ...}}})", path, err)
	}
	if file.CredsStore != "" || len(file.CredHelpers) > 0 {
		return nil, errdefs.Invalidf("registry auth file %s names credential helpers (credsStore, credHelpers): the node runs none; put the credentials under \"auths\"", path)
	}
	out := RegistryAuth{}
	for key, c := range file.Auths {
		host, err := registryKey(key)
		if err != nil {
			return nil, errdefs.Invalidf("registry auth file %s: entry %q: %v", path, key, err)
		}
		if c.Username == "" && c.Password == "" && c.IdentityToken == "" && c.RegistryToken == "" {
			return nil, errdefs.Invalidf("registry auth file %s: entry %q has no credentials", path, key)
		}
		if (c.Username == "") != (c.Password == "") {
			return nil, errdefs.Invalidf("registry auth file %s: entry %q has half a username and password", path, key)
		}
		if _, dup := out[host]; dup {
			return nil, errdefs.Invalidf("registry auth file %s: two entries for registry %s", path, host)
		}
		out[host] = c
	}
	return out, nil
}

// registryKey turns a key of Docker's "auths" ("registry.example.com",
// "host:5000", "https://index.docker.io/v1/") into the registry as a
// reference names it (go-containerregistry's RegistryStr).
func registryKey(key string) (string, error) {
	s := key
	for _, scheme := range []string{"https://", "http://"} {
		s = strings.TrimPrefix(s, scheme)
	}
	s, _, _ = strings.Cut(s, "/")
	r, err := name.NewRegistry(s, name.StrictValidation)
	if err != nil || s == "" {
		return "", fmt.Errorf("want a registry host or host:port")
	}
	return r.RegistryStr(), nil
}
