package quota

import (
	"context"
	"fmt"
	"testing"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/testsvc"
)

// BenchmarkRound measures one coordination round (the lease renewal, the
// read of the members and penalties and the publication of the share: one
// transaction in two round trips) with 3 members and 1 or 4 models.
func BenchmarkRound(b *testing.B) {
	for _, nModels := range []int{1, 4} {
		b.Run(fmt.Sprintf("models=%d", nModels), func(b *testing.B) {
			pool := testsvc.Postgres(b)
			models := map[string]config.Model{}
			for i := range nModels {
				models[fmt.Sprint("m", i)] = cfgModel
			}
			var cs []*Coordinator
			for _, id := range []string{"a", "b", "c"} {
				c := New(pool, id, models, func(string) Governor { return &fakeGov{} }, q, WithDemand(full))
				cs = append(cs, c)
			}
			ctx := context.Background()
			for _, c := range cs {
				if rep := c.tick(ctx); rep.Err != nil {
					b.Fatal(rep.Err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if rep := cs[i%3].tick(ctx); rep.Err != nil {
					b.Fatal(rep.Err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/round")
		})
	}
}
