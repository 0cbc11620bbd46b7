package flow

import (
	"testing"
	"time"
)

func BenchmarkBucketReserve(b *testing.B) {
	t0 := time.Unix(0, 0)
	bk := NewBucket(1e12, 1e12, 1e12, t0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		bk.Reserve(t0.Add(time.Duration(i)), 1)
	}
}
