package control

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/secrets"
	"github.com/spore-run/spore/internal/store"
)

// MaxRulesPerDomain bounds the transform rules of one domain.
const MaxRulesPerDomain = 16

// secretPrefix opens a placeholder the proxy's values get from a secret:
// ${e2b.secrets.NAME} (the stock SDK's Secret.fill).
const secretPrefix = "${e2b.secrets."

// ParseRules checks E2B's network rules and returns them normalized:
// keys are domains in egress.ParseDomain's form (an exact name or
// "*.name", lower case; a bare "*" is refused) given once, each with at
// most MaxRulesPerDomain rules whose headers egress.ValidateInjections
// accepts; header values may hold ${e2b.secrets.NAME} placeholders (a
// secret name, checked to exist when the rules are applied). Workload
// identity placeholders are refused: Spore mints no such tokens.
func ParseRules(rules map[string][]store.NetworkRule) (map[string][]store.NetworkRule, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	out := make(map[string][]store.NetworkRule, len(rules))
	for _, key := range slices.Sorted(maps.Keys(rules)) {
		d, err := egress.ParseDomain(key)
		if err != nil {
			return nil, errdefs.Invalidf("network rules: %v", err)
		}
		if _, dup := out[d]; dup {
			return nil, errdefs.Invalidf("network rules: %q given twice (keys are lower-cased)", d)
		}
		list := rules[key]
		if len(list) > MaxRulesPerDomain {
			return nil, errdefs.Invalidf("network rules for %s: %d rules, at most %d", d, len(list), MaxRulesPerDomain)
		}
		for _, r := range list {
			for _, v := range r.Headers {
				if _, err := placeholders(v); err != nil {
					return nil, errdefs.Invalidf("network rules for %s: %v", d, err)
				}
			}
		}
		out[d] = slices.Clone(list)
	}
	if err := egress.ValidateInjections(injections(out, nil)); err != nil {
		return nil, err
	}
	return out, nil
}

// placeholders returns the secret names a header value refers to.
func placeholders(v string) ([]string, error) {
	var names []string
	for rest := v; ; {
		i := strings.Index(rest, "${e2b.")
		if i < 0 {
			return names, nil
		}
		rest = rest[i:]
		if !strings.HasPrefix(rest, secretPrefix) {
			if strings.HasPrefix(rest, "${e2b.identity.") {
				return nil, fmt.Errorf("%.40q: workload identity tokens are not supported by Spore", rest)
			}
			return nil, fmt.Errorf("%.40q: the only placeholder is ${e2b.secrets.NAME}", rest)
		}
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return nil, fmt.Errorf("%.40q: placeholder without its closing '}'", rest)
		}
		name, err := secrets.NormalizeName(rest[len(secretPrefix):end])
		if err != nil {
			return nil, err
		}
		names = append(names, name)
		rest = rest[end+1:]
	}
}

// injections turns rules into the node's injections (a domain's rules
// merged in order: a later rule's header wins), with each value passed
// through resolve when set.
func injections(rules map[string][]store.NetworkRule, resolve func(string) string) []egress.Injection {
	var out []egress.Injection
	for _, d := range slices.Sorted(maps.Keys(rules)) {
		merged := map[string]string{}
		var order []string
		for _, r := range rules[d] {
			for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
				ck := strings.ToLower(k)
				if _, ok := merged[ck]; !ok {
					order = append(order, ck)
				}
				v := r.Headers[k]
				if resolve != nil {
					v = resolve(v)
				}
				merged[ck] = v
			}
		}
		in := egress.Injection{Pattern: d}
		for _, k := range order {
			in.Headers = append(in.Headers, egress.Header{Name: k, Value: merged[k]})
		}
		out = append(out, in)
	}
	return out
}

// resolveRules turns a sandbox's rules into the node's injections, the
// placeholders replaced by their secrets' current values. A secret that
// does not exist is ErrInvalidArgument naming it when strict (rules being
// given); otherwise (rules set again: a secret deleted since) the headers
// that name it are left out, so its value stops going anywhere.
func (s *Service) resolveRules(ctx context.Context, team string, rules map[string][]store.NetworkRule, strict bool) ([]nodeapi.Injection, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	values, missing := map[string]string{}, map[string]bool{}
	for _, list := range rules {
		for _, r := range list {
			for _, v := range r.Headers {
				names, err := placeholders(v)
				if err != nil {
					return nil, errdefs.Invalidf("network rules: %v", err)
				}
				for _, n := range names {
					if _, ok := values[n]; ok || missing[n] {
						continue
					}
					val, err := s.secretValue(ctx, team, n)
					if errdefs.IsNotFound(err) {
						if !strict {
							missing[n] = true
							continue
						}
						return nil, errdefs.Invalidf("network rules: secret %q does not exist", n)
					}
					if err != nil {
						return nil, err
					}
					values[n] = val
				}
			}
		}
	}
	resolve := func(v string) string {
		var b strings.Builder
		for {
			i := strings.Index(v, secretPrefix)
			if i < 0 {
				b.WriteString(v)
				return b.String()
			}
			end := strings.IndexByte(v[i:], '}') + i
			name, _ := secrets.NormalizeName(v[i+len(secretPrefix) : end])
			b.WriteString(v[:i])
			b.WriteString(values[name])
			v = v[end+1:]
		}
	}
	if len(missing) > 0 {
		// Drop the headers that name a missing secret.
		kept := make(map[string][]store.NetworkRule, len(rules))
		for d, list := range rules {
			for _, r := range list {
				nr := store.NetworkRule{Headers: map[string]string{}}
				for k, v := range r.Headers {
					names, _ := placeholders(v)
					if !slices.ContainsFunc(names, func(n string) bool { return missing[n] }) {
						nr.Headers[k] = v
					}
				}
				kept[d] = append(kept[d], nr)
			}
		}
		rules = kept
	}
	var out []nodeapi.Injection
	for _, in := range injections(rules, resolve) {
		ni := nodeapi.Injection{Pattern: in.Pattern}
		for _, h := range in.Headers {
			ni.Headers = append(ni.Headers, nodeapi.Header{Name: h.Name, Value: h.Value})
		}
		out = append(out, ni)
	}
	return out, nil
}

// usesSecret says whether rules name a secret.
func usesSecret(rules map[string][]store.NetworkRule, name string) bool {
	for _, list := range rules {
		for _, r := range list {
			for _, v := range r.Headers {
				if names, _ := placeholders(v); slices.Contains(names, name) {
					return true
				}
			}
		}
	}
	return false
}

// pushSecret sets again the policy of every sandbox of the team whose
// rules name a secret that changed (a new version, or deleted), so their requests
// carry the new value (or none) from now on. Best effort: a node that
// cannot be told is logged, and the sandbox keeps the value it had.
func (s *Service) pushSecret(ctx context.Context, team, name string) {
	cursor := ""
	for {
		page, next, err := s.st.ListSandboxes(ctx, store.SandboxFilter{TeamID: team, Limit: 500, Cursor: cursor,
			States: []string{store.StateRunning, store.StatePaused, store.StateHibernated}})
		if err != nil {
			s.log.Warn("secret changed: sandboxes not listed, their rules keep the old value", "secret", name, "err", err)
			return
		}
		for _, rec := range page {
			if !usesSecret(rec.NetworkRules, name) {
				continue
			}
			n, err := s.nodeOf(rec)
			if err == nil {
				var p nodeapi.Policy
				if p, err = s.policyOf(ctx, rec); err == nil {
					err = n.SetPolicy(ctx, rec.ID, p)
				}
			}
			if err != nil && !errdefs.IsNotFound(err) {
				s.log.Warn("secret changed: a sandbox's rules keep the old value", "secret", name, "sandbox_id", rec.ID, "err", err)
			}
		}
		if next == "" {
			return
		}
		cursor = next
	}
}

// secretValue opens the current value of a team's secret by name.
func (s *Service) secretValue(ctx context.Context, team, name string) (string, error) {
	box, err := s.secretsBox()
	if err != nil {
		return "", err
	}
	sec, err := s.st.GetSecret(ctx, team, name)
	if err != nil {
		return "", err
	}
	v, err := box.Open(sec.ID, sec.Version, sec.Sealed)
	return string(v), err
}

// caAAD binds a sealed egress CA to its use.
const caAAD = "egress-ca"

// mintCA makes a sandbox's egress CA (named after id when known), sealed
// for its row.
func (s *Service) mintCA(id string) ([]byte, error) {
	box, err := s.secretsBox()
	if err != nil {
		return nil, err
	}
	ca, err := egress.NewCA(id)
	if err != nil {
		return nil, err
	}
	return box.Seal(caAAD, 0, append(append([]byte(nil), ca.CertPEM...), ca.KeyPEM...)), nil
}

// openCA unseals a row's egress CA.
func (s *Service) openCA(sealed []byte) (*nodeapi.CA, error) {
	box, err := s.secretsBox()
	if err != nil {
		return nil, err
	}
	b, err := box.Open(caAAD, 0, sealed)
	if err != nil {
		return nil, err
	}
	i := strings.Index(string(b), "-----BEGIN EC PRIVATE KEY-----")
	if i < 0 {
		return nil, fmt.Errorf("%w: sealed egress CA malformed", errdefs.ErrDataLoss)
	}
	return &nodeapi.CA{CertPEM: b[:i], KeyPEM: b[i:]}, nil
}

// withRules completes a policy with a row's network rules: the resolved
// headers (strict: see resolveRules) and the CA (minted into the row by
// the caller when it has none yet).
func (s *Service) withRules(ctx context.Context, p nodeapi.Policy, rec store.Sandbox, strict bool) (nodeapi.Policy, error) {
	if len(rec.NetworkRules) == 0 {
		return p, nil
	}
	inject, err := s.resolveRules(ctx, teamOf(rec), rec.NetworkRules, strict)
	if err != nil {
		return p, err
	}
	if len(rec.EgressCA) == 0 {
		return p, fmt.Errorf("%w: sandbox %s has network rules but no egress CA", errdefs.ErrInternal, rec.ID)
	}
	ca, err := s.openCA(rec.EgressCA)
	if err != nil {
		return p, err
	}
	p.Inject, p.CA = inject, ca
	return p, nil
}

// policyOf is a row's whole egress policy, for a node (rules resolved
// leniently: a secret deleted since they were given is left out).
func (s *Service) policyOf(ctx context.Context, rec store.Sandbox) (nodeapi.Policy, error) {
	allow := rec.AllowInternet
	p, err := ParsePolicy(&allow, rec.AllowOut, rec.DenyOut)
	if err != nil {
		return p, err
	}
	return s.withRules(ctx, p, rec, false)
}

// reloadRules sets a sandbox's whole policy on its node again, for a node
// that forgot its network rules. Failures are logged: the next reconcile
// tries again.
func (s *Service) reloadRules(ctx context.Context, n nodeapi.Node, rec store.Sandbox) {
	p, err := s.policyOf(ctx, rec)
	if err == nil {
		err = n.SetPolicy(ctx, rec.ID, p)
	}
	if err != nil {
		s.log.Warn("reconcile: network rules not set again on the node", "sandbox_id", rec.ID, "node_id", rec.NodeID, "err", err)
		return
	}
	s.log.Info("reconcile: network rules set again on the node", "sandbox_id", rec.ID, "node_id", rec.NodeID)
}
