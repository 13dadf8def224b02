package hotkey

import (
	"testing"

	"github.com/keyshard/keyshard/keyshardtest"
)

func TestPure(t *testing.T) { keyshardtest.CheckPureCore(t) }
