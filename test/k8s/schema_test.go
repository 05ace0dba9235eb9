package k8s

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// apiSchema is the Kubernetes API's OpenAPI v2 document (api/openapi-spec/swagger.json of the
// k8s.io/kubernetes module the API server is built from): the definitions the API server itself
// decodes objects with. check validates a manifest against it strictly, the way kubeconform's
// -strict does: an unknown field anywhere is an error (additionalProperties false on every object
// that lists its properties), as are wrong types and missing required fields. The document carries
// no enums or value rules (which values a field takes, e.g. imagePullPolicy): the API server checks
// those when the cluster test installs the chart.
type apiSchema struct {
	defs  map[string]*schemaNode
	byGVK map[string]string // "group/version/Kind" -> definition name
}

type schemaNode struct {
	Ref                  string                 `json:"$ref"`
	Type                 string                 `json:"type"`
	Format               string                 `json:"format"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties *schemaNode            `json:"additionalProperties"`
	Items                *schemaNode            `json:"items"`
	Required             []string               `json:"required"`
	GVK                  []struct {
		Group, Version, Kind string
	} `json:"x-kubernetes-group-version-kind"`
}

const (
	quantityDef    = "io.k8s.apimachinery.pkg.api.resource.Quantity"
	intOrStringFmt = "int-or-string"
)

func loadAPISchema(t testing.TB, path string) *apiSchema {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("Kubernetes OpenAPI document: %v", err)
	}
	var doc struct {
		Definitions map[string]*schemaNode `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("Kubernetes OpenAPI document %s: %v", path, err)
	}
	s := &apiSchema{defs: doc.Definitions, byGVK: map[string]string{}}
	for name, d := range doc.Definitions {
		for _, g := range d.GVK {
			s.byGVK[g.Group+"/"+g.Version+"/"+g.Kind] = name
		}
	}
	if len(s.byGVK) < 50 {
		t.Fatalf("Kubernetes OpenAPI document %s: only %d kinds", path, len(s.byGVK))
	}
	return s
}

// check returns every way obj (one decoded manifest) departs from the API's schema.
func (s *apiSchema) check(obj map[string]any) []string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group, version, ok := strings.Cut(apiVersion, "/")
	if !ok {
		group, version = "", apiVersion
	}
	def, found := s.byGVK[group+"/"+version+"/"+kind]
	if !found {
		return []string{fmt.Sprintf("%s %s: no such kind in this Kubernetes API", apiVersion, kind)}
	}
	var errs []string
	s.walk(kind, obj, &schemaNode{Ref: "#/definitions/" + def}, "", &errs)
	if md, _ := obj["metadata"].(map[string]any); md == nil || md["name"] == nil || md["name"] == "" {
		errs = append(errs, kind+": metadata.name is empty")
	}
	return errs
}

func (s *apiSchema) walk(path string, v any, n *schemaNode, def string, errs *[]string) {
	bad := func(format string, args ...any) {
		*errs = append(*errs, path+": "+fmt.Sprintf(format, args...))
	}
	if v == nil { // an explicit null is an absent field to the API server
		return
	}
	if n.Ref != "" {
		name := strings.TrimPrefix(n.Ref, "#/definitions/")
		d, ok := s.defs[name]
		if !ok {
			bad("schema has no definition %s", name)
			return
		}
		s.walk(path, v, d, name, errs)
		return
	}
	// Quantities ("500m", 2) and int-or-string ports ("http", 3000) take either form.
	if def == quantityDef {
		switch v.(type) {
		case string, int, float64:
		default:
			bad("want a quantity, got %T", v)
		}
		return
	}
	if n.Format == intOrStringFmt {
		switch v.(type) {
		case string, int:
		default:
			bad("want an integer or a string, got %T", v)
		}
		return
	}
	switch n.Type {
	case "object", "":
		m, ok := v.(map[string]any)
		if n.Type == "" && len(n.Properties) == 0 && n.AdditionalProperties == nil {
			return // free-form (RawExtension, JSON): the API takes anything
		}
		if !ok {
			bad("want an object, got %T", v)
			return
		}
		if len(n.Properties) > 0 {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				p, ok := n.Properties[k]
				if !ok {
					bad("unknown field %q", k)
					continue
				}
				s.walk(path+"."+k, m[k], p, "", errs)
			}
			for _, r := range n.Required {
				if _, ok := m[r]; !ok {
					bad("missing required field %q", r)
				}
			}
		} else if n.AdditionalProperties != nil {
			for k, e := range m {
				s.walk(path+"."+k, e, n.AdditionalProperties, "", errs)
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			bad("want an array, got %T", v)
			return
		}
		if n.Items != nil {
			for i, e := range a {
				s.walk(fmt.Sprintf("%s[%d]", path, i), e, n.Items, "", errs)
			}
		}
	case "string":
		if _, ok := v.(string); !ok {
			bad("want a string, got %T (%v)", v, v)
		}
	case "integer":
		switch x := v.(type) {
		case int:
		case float64:
			if x != float64(int64(x)) {
				bad("want an integer, got %v", x)
			}
		default:
			bad("want an integer, got %T (%v)", v, v)
		}
	case "number":
		switch v.(type) {
		case int, float64:
		default:
			bad("want a number, got %T (%v)", v, v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("want a boolean, got %T (%v)", v, v)
		}
	default:
		bad("schema type %q unknown to this check", n.Type)
	}
}

// decodeManifests splits a multi-document YAML stream (helm template's output) into objects.
func decodeManifests(t testing.TB, out []byte) []map[string]any {
	t.Helper()
	var objs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered manifests are not YAML: %v\n%s", err, out)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}
