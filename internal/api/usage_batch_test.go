package api

import (
	"testing"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/store"
)

// A batch's calls are priced at the model's price less its discount.
func TestUsagePricesBatchCallsAtTheDiscount(t *testing.T) {
	models := map[string]config.Model{"m": {Price: config.Price{InputPerMillion: 2, OutputPerMillion: 8},
		Batch: config.Batch{Enabled: true, Discount: 0.5}}}
	online, ok := priceModel(models, "m")
	if !ok || online.Price.Cost(1e6, 1e6) != 10 {
		t.Fatalf("online price: %+v %v", online.Price, ok)
	}
	batch, ok := priceModel(models, "m"+store.BatchUsageSuffix)
	if !ok || batch.Price.Cost(1e6, 1e6) != 5 {
		t.Fatalf("batch price: %+v %v", batch.Price, ok)
	}
	if _, ok := priceModel(models, "other"+store.BatchUsageSuffix); ok {
		t.Fatal("an unknown model has no price")
	}
}
