package pod

import "testing"

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { RunTests(m) }
