package job

import (
	"errors"
	"testing"
)

// The whole table, written out independently of the map in status.go, so a
// change to either is caught: every (from, to) pair is checked.
func TestTransitionTableExhaustive(t *testing.T) {
	allowed := map[[2]Status]bool{
		{StatusQueued, StatusRunning}: true, {StatusQueued, StatusCancelled}: true, {StatusQueued, StatusDead}: true, {StatusQueued, StatusFailed}: true,
		{StatusRunning, StatusSucceeded}: true, {StatusRunning, StatusFailed}: true, {StatusRunning, StatusRetrying}: true,
		{StatusRunning, StatusDead}: true, {StatusRunning, StatusQueued}: true, {StatusRunning, StatusCancelled}: true,
		{StatusRetrying, StatusRunning}: true, {StatusRetrying, StatusCancelled}: true, {StatusRetrying, StatusDead}: true,
		{StatusRetrying, StatusQueued}: true,
		{StatusRunning, StatusBatched}: true, {StatusBatched, StatusSucceeded}: true, {StatusBatched, StatusRetrying}: true,
		{StatusBatched, StatusCancelled}: true,
		{StatusFailed, StatusQueued}:     true, {StatusDead, StatusQueued}: true,
	}
	for _, from := range Statuses {
		for _, to := range Statuses {
			want := allowed[[2]Status{from, to}]
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
			err := Transition(from, to)
			var te *TransitionError
			if want && err != nil {
				t.Errorf("Transition(%s, %s) = %v, want nil", from, to, err)
			}
			if !want && !errors.As(err, &te) {
				t.Errorf("Transition(%s, %s) = %v, want *TransitionError", from, to, err)
			}
		}
	}
}

func TestAllowedFromMatchesTable(t *testing.T) {
	for _, to := range Statuses {
		from := AllowedFrom(to)
		seen := map[Status]bool{}
		for _, f := range from {
			seen[f] = true
			if !CanTransition(f, to) {
				t.Errorf("AllowedFrom(%s) lists %s, which cannot move there", to, f)
			}
		}
		for _, f := range Statuses {
			if CanTransition(f, to) && !seen[f] {
				t.Errorf("AllowedFrom(%s) misses %s", to, f)
			}
		}
	}
}

func TestTerminalStatusesHaveNoWorkLeft(t *testing.T) {
	for _, s := range Statuses {
		wantTerminal := s == StatusSucceeded || s == StatusFailed || s == StatusDead || s == StatusCancelled
		if s.Terminal() != wantTerminal {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if Status("paused").Valid() {
		t.Error("unknown status reported valid")
	}
	// Succeeded and cancelled are final: nothing, not even replay, leaves them.
	for _, s := range []Status{StatusSucceeded, StatusCancelled} {
		for _, to := range Statuses {
			if CanTransition(s, to) {
				t.Errorf("%s may move to %s", s, to)
			}
		}
	}
}
