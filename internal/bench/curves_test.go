package bench

import (
	"slices"
	"strings"
	"testing"
)

// TestForkLevels: which forks the fork section times, by default and with
// --fork-levels, --fork-reps and --quick.
func TestForkLevels(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []forkLevel
	}{
		{"default", Config{Count: 20}, []forkLevel{{1, 10}, {10, 3}, {50, 1}, {100, 1}}},
		{"few ops", Config{Count: 2}, []forkLevel{{1, 2}, {10, 3}, {50, 1}, {100, 1}}},
		{"quick", Config{Count: 2, Quick: true, ForkReps: 5}, []forkLevel{{1, 1}, {2, 1}}},
		{"levels", Config{Count: 20, ForkLevels: []int{10, 100}}, []forkLevel{{10, 3}, {100, 1}}},
		{"reps", Config{Count: 20, ForkReps: 5}, []forkLevel{{1, 10}, {10, 5}, {50, 5}, {100, 5}}},
		{"levels and reps", Config{Count: 20, ForkLevels: []int{1, 100}, ForkReps: 2}, []forkLevel{{1, 10}, {100, 2}}},
	} {
		if got := forkLevels(tc.cfg); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if s := settingsLine(Settings{ForkReps: 5}); !strings.Contains(s, "5 forks of each n > 1") {
		t.Errorf("settings line %q does not name the fork repetitions", s)
	}
	if s := settingsLine(Settings{}); strings.Contains(s, "forks of each") {
		t.Errorf("settings line %q names fork repetitions that were not set", s)
	}
	if s := settingsLine(Settings{Local: true, RestoreTargets: 2, RestoreTargetsBurst: 16}); !strings.Contains(s, "restore targets per shape 2, up to 16 after a burst") {
		t.Errorf("settings line %q does not name the targets a burst grows to", s)
	}
	if s := settingsLine(Settings{Local: true, RestoreTargets: 2}); strings.Contains(s, "after a burst") {
		t.Errorf("settings line %q names a burst growth that was off", s)
	}
}
