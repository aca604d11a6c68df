package dns_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}
