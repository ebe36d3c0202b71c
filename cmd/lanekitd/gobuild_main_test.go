package main

import (
	"os"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestMain removes the binaries the tests built once and shared
// (testutil.GoBuild).
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveGoBuilds()
	os.Exit(code)
}
