package api_test

import (
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// TestMain stops the throwaway PostgreSQL cluster the fast tests that run
// in the postgres-rpc configuration start (controltest.Configs).
func TestMain(m *testing.M) { testenv.Main(m) }
