package results_test

import (
	"testing"

	"github.com/llmq/llmq/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
