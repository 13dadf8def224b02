package architecture_test

import (
	"testing"

	"github.com/keyshard/keyshard/keyshardtest"
)

// TestPureCores: the SDK's pure cores import no network, storage or RPC
// package, read no clock and start no goroutine. (internal/coordinator
// checks itself.)
func TestPureCores(t *testing.T) {
	keyshardtest.CheckPureCore(t, "../../placement", "../../hotkey", "../tenantpool")
}
