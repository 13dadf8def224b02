package shard_test

import (
	"testing"

	"github.com/keyshard/keyshard/keyshardtest"
)

func TestPureCore(t *testing.T) { keyshardtest.CheckPureCore(t) }
