package kafka

import "testing"

func TestOffsetTrackerCommitsLowestUnfinished(t *testing.T) {
	tr := newOffsetTracker()
	for o := int64(10); o < 15; o++ {
		if !tr.fetched(o) {
			t.Fatalf("fetched(%d) refused", o)
		}
	}
	steps := []struct {
		finish   int64
		want     int64
		advanced bool
	}{
		{12, -1, false}, // 10 and 11 unfinished
		{11, -1, false},
		{10, 13, true}, // 10,11,12 done → next to read is 13
		{14, 13, false},
		{13, 15, true},
	}
	for _, s := range steps {
		got, adv := tr.finish(s.finish)
		if got != s.want || adv != s.advanced {
			t.Fatalf("finish(%d) = %d,%v want %d,%v", s.finish, got, adv, s.want, s.advanced)
		}
	}
	if tr.fetched(3) {
		t.Fatal("rewound offset accepted")
	}
}
