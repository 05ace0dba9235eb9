package store

import (
	"encoding/json"
	"fmt"
)

// EncodeKeyScope is how the stores keep a key's scope: JSON, "" for none.
func EncodeKeyScope(sc *KeyScope) string {
	if sc == nil {
		return ""
	}
	b, _ := json.Marshal(sc)
	return string(b)
}

// DecodeKeyScope reads what EncodeKeyScope wrote.
func DecodeKeyScope(s string) (*KeyScope, error) {
	if s == "" {
		return nil, nil
	}
	var sc KeyScope
	if err := json.Unmarshal([]byte(s), &sc); err != nil {
		return nil, fmt.Errorf("key scope: %w", err)
	}
	return &sc, nil
}
